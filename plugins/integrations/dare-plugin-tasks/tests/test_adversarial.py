"""Graders that cannot be gamed: a table of adversarial outputs per task, each scoring 0, and every
task's reference answers scoring 1 (docs/evaluation.md, "Graders").

Most rows pass a grader that runs the tests in the candidate's own namespace or evaluates
countdown answers with Python's ``eval`` (always-equal results, rebound builtins,
patched modules, a redefined prompt helper, ``**``, ``5=7``, ``\\pm 7``); the honest solutions
in ``CODE_REFERENCES`` pass the items the code rows attack.
"""

from __future__ import annotations

import json
import random

import pytest

from dare_core.interfaces.seams import Example
from dare_plugin_tasks.countdown import CountdownTask, generate_countdown, solve_countdown
from dare_plugin_tasks.parquet import (
    AIME2024Task,
    AIME2025Task,
    GSM8KTask,
    HumanEvalTask,
    Math500Task,
    MBPPTask,
)
from dare_plugin_tasks.rewards import _parse_latex, _relation_refused, score_example
from dare_plugin_tasks.sudoku import SudokuTask

PUZZLE = "3102200002100320"
SOLUTION = "3142243142131324"
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


def _example(source: str, truth: str, **info) -> Example:
    return Example(prompt=[{"role": "user", "content": "q"}], ground_truth=truth, data_source=source, extra_info=info)


def _countdown(numbers: list[int], target: int) -> Example:
    return _example("countdown", str(target), numbers=json.dumps(numbers))


def _mbpp(*tests: str) -> Example:
    return _example("mbpp", json.dumps(list(tests)), task="code")


HUMANEVAL = {i: ex for i, ex in enumerate(HumanEvalTask().eval_set()) if i in (0, 2, 32)}
MBPP = {i: ex for i, ex in enumerate(MBPPTask().eval_set()) if i in (1, 3, 5)}
SET_ITEM = _mbpp("assert set(evens(5)) == set([0, 2, 4])")
ISCLOSE_ITEM = _mbpp("import math", "assert math.isclose(area(2.0), 12.566, rel_tol=1e-3)")

ALWAYS_EQUAL = (
    "class Any:\n    def __eq__(self, other):\n        return True\n\n    def __sub__(self, other):\n        return 0\n"
)

# (id, example, response): every row must score 0
ADVERSARIAL = [
    # ---- countdown: operators, literals and forms outside + - * / on the given integers
    ("countdown-power", _countdown([2, 3, 5], 22), "<answer>5**2-3</answer>"),
    ("countdown-floordiv", _countdown([2, 3, 5], 4), "<answer>(3+5)//2</answer>"),
    ("countdown-decimal-glue", _countdown([3, 5, 2], 7), "<answer>3.5*2</answer>"),
    ("countdown-underscore-glue", _countdown([2, 3, 5], 22), "<answer>2_5-3</answer>"),
    ("countdown-modulo", _countdown([2, 3, 5], 4), "<answer>5%3*2</answer>"),
    ("countdown-equation", _countdown([2, 3, 4], 5), "<answer>2*4-3=5</answer>"),
    ("countdown-tuple", _countdown([2, 3, 4], 5), "<answer>(5, 2+3+4)</answer>"),
    ("countdown-call", _countdown([2, 3, 4], 5), "<answer>max(5, 2*3*4)</answer>"),
    ("countdown-fullwidth-digits", _countdown([2, 3, 4], 5), "<answer>２*４-３</answer>"),
    ("countdown-no-tag", _countdown([2, 3, 4], 5), "2*4-3"),
    # ---- math: relations, hedges and sets are not the value
    ("math-false-equation", _example("math500", "7"), "\\boxed{5=7}"),
    ("math-true-equation", _example("math500", "5"), "\\boxed{\\frac{10}{2}=5}"),
    ("math-sum-equation", _example("gsm8k", "7"), "\\boxed{a+b=7}"),
    ("math-chained-equation", _example("math500", "7"), "\\boxed{x=y=7}"),
    ("math-reversed-assignment", _example("math500", "7"), "\\boxed{7=x}"),
    ("math-inequality", _example("math500", "7"), "\\boxed{6<7}"),
    ("math-not-equal", _example("math500", "7"), "\\boxed{7\\neq 8}"),
    ("math-or-hedge", _example("gsm8k", "7"), "\\boxed{7 \\text{ or } 8}"),
    ("math-list-hedge", _example("gsm8k", "7"), "\\boxed{7, 8}"),
    ("math-set-hedge", _example("math500", "7"), "\\boxed{\\{7, 8\\}}"),
    ("math-plus-minus", _example("math500", "7"), "\\boxed{\\pm 7}"),
    ("math-interval", _example("math500", "7"), "\\boxed{[6, 8]}"),
    ("math-unknown", _example("math500", "7"), "\\boxed{x}"),
    ("math-no-box", _example("gsm8k", "7"), "The answer is 7."),
    # ---- sudoku: only ASCII digits in the last <answer> block count
    ("sudoku-echo-puzzle", _example("sudoku", SOLUTION, puzzle=PUZZLE), f"<answer>{PUZZLE}</answer>"),
    (
        "sudoku-fullwidth-digits",
        _example("sudoku", SOLUTION, puzzle=PUZZLE),
        "<answer>" + SOLUTION.translate(FULLWIDTH) + "</answer>",
    ),
    (
        "sudoku-outside-tag",
        _example("sudoku", SOLUTION, puzzle=PUZZLE),
        f"<reasoning>{SOLUTION}</reasoning><answer></answer>",
    ),
    ("sudoku-unclosed-tag", _example("sudoku", SOLUTION, puzzle=PUZZLE), f"<answer>{SOLUTION}"),
    # ---- code: results cross to the checker by value; its builtins, modules and helpers are its own
    (
        "code-always-equal-object",
        HUMANEVAL[2],
        f"```python\n{ALWAYS_EQUAL}\ndef truncate_number(number):\n    return Any()\n```",
    ),
    (
        "code-rebind-builtin-abs",
        HUMANEVAL[2],
        "```python\nimport builtins\nbuiltins.abs = lambda x: 0\n\ndef truncate_number(number):\n    return 0.5\n```",
    ),
    (
        "code-redefine-prompt-helper",
        HUMANEVAL[32],
        "```python\ndef poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n```",
    ),
    (
        "code-patch-module-attribute",
        HUMANEVAL[32],
        "```python\nimport math\nmath.fabs = lambda x: 0.0\n\ndef find_zero(xs):\n    return 0.0\n```",
    ),
    (
        "code-int-subclass",
        MBPP[3],
        "class I(int):\n    __hash__ = int.__hash__\n\n    def __eq__(self, other):\n        return True\n\n"
        "def find_Volume(l, b, h):\n    return I(0)\n",
    ),
    (
        "code-list-subclass",
        MBPP[1],
        "class L(list):\n    def __eq__(self, other):\n        return True\n\ndef sort_matrix(m):\n    return L()\n",
    ),
    (
        "code-str-subclass",
        MBPP[5],
        "class S(str):\n    def __eq__(self, other):\n        return True\n\n"
        "def text_lowercase_underscore(text):\n    return S()\n",
    ),
    ("code-exit-before-tests", MBPP[3], "import os\nos._exit(0)\n"),
    ("code-forge-marker", MBPP[3], "open('.dare_done', 'wb').write(b'0' * 32)\nimport os\nos._exit(0)\n"),
    ("code-shadow-builtin-set", SET_ITEM, "def set(*args):\n    return 1\n\ndef evens(n):\n    return []\n"),
    (
        "code-patch-math-isclose",
        ISCLOSE_ITEM,
        "import math\nmath.isclose = lambda *a, **k: True\n\ndef area(r):\n    return 0.0\n",
    ),
]

# honest solutions of the items the code rows attack: each must score 1
CODE_REFERENCES = [
    ("truncate_number", HUMANEVAL[2], "```python\ndef truncate_number(number):\n    return number % 1.0\n```"),
    (
        "find_zero",
        HUMANEVAL[32],
        "```python\ndef find_zero(xs):\n    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n"
        "        lo, hi = lo * 2.0, hi * 2.0\n    for _ in range(200):\n        mid = (lo + hi) / 2.0\n"
        "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n        else:\n"
        "            lo = mid\n    return lo\n```",
    ),
    (
        "has_close_elements",
        HUMANEVAL[0],
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n",
    ),
    ("find_Volume", MBPP[3], "def find_Volume(l, b, h):\n    return (l * b * h) / 2\n"),
    ("sort_matrix", MBPP[1], "def sort_matrix(m):\n    return sorted(m, key=sum)\n"),
    (
        "text_lowercase_underscore",
        MBPP[5],
        "import re\n\ndef text_lowercase_underscore(text):\n"
        "    return 'Found a match!' if re.search('^[a-z]+_[a-z]+$', text) else 'Not matched!'\n",
    ),
    ("evens", SET_ITEM, "def evens(n):\n    return [i for i in range(n) if i % 2 == 0]\n"),
    ("area", ISCLOSE_ITEM, "import math\n\ndef area(r):\n    return math.pi * r * r\n"),
]


def test_the_table_is_large_enough():
    assert len(ADVERSARIAL) >= 25
    assert len({row[0] for row in ADVERSARIAL}) == len(ADVERSARIAL)


@pytest.mark.parametrize("name, example, response", ADVERSARIAL, ids=[row[0] for row in ADVERSARIAL])
def test_adversarial_output_scores_zero(name, example, response):
    score = score_example(example, response)
    assert (score.score, score.acc) == (0.0, 0.0), score


@pytest.mark.parametrize("name, example, response", CODE_REFERENCES, ids=[row[0] for row in CODE_REFERENCES])
def test_code_reference_scores_one(name, example, response):
    score = score_example(example, response)
    assert (score.score, score.acc, score.kind) == (1.0, 1.0, "passed"), score


def test_countdown_references_score_one():
    items = CountdownTask().eval_set() + generate_countdown(50, seed=3)
    solved = 0
    for ex in items:
        numbers = json.loads(ex.extra_info["numbers"])
        expression = solve_countdown(numbers).get(int(ex.ground_truth))
        if ex.response is not None:
            assert score_example(ex, ex.response).score == 1.0, ex.response
        if expression is not None:  # every test item: the integer solver reaches each target
            solved += 1
            assert score_example(ex, f"<answer>{expression}</answer>").score == 1.0, expression
    assert solved >= 256


def test_sudoku_references_score_one():
    for ex in SudokuTask().eval_set():
        assert score_example(ex, f"<answer>{ex.ground_truth}</answer>").score == 1.0


@pytest.mark.parametrize("task", [GSM8KTask, Math500Task, AIME2024Task, AIME2025Task])
def test_math_references_score_one(task):
    items = task().eval_set()
    for ex in items:
        assert score_example(ex, f"So the answer is \\boxed{{{ex.ground_truth}}}.").score == 1.0
    # the same references through math-verify itself (a sample: parsing is slow on 2 cores)
    for ex in random.Random(0).sample(items, min(40, len(items))):
        gold = _parse_latex(ex.ground_truth)
        assert gold and not _relation_refused(gold, gold), ex.ground_truth
