"""HumanEval / HumanEval+ / MBPP tasks and the sandboxed code reward, on the bundled real items."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dare_core.config import TaskConfig
from dare_core.errors import DareError
from dare_core.interfaces.seams import Example
from dare_plugin_tasks._base import DATA_DIR
from dare_plugin_tasks.code import (
    code_reward,
    code_tests,
    entry_point_of,
    extract_code,
    program_for,
    prompt_code,
)
from dare_plugin_tasks.parquet import HumanEvalPlusTask, HumanEvalTask, MBPPTask
from dare_plugin_tasks.rewards import UnsupportedDataSourceError, score_example

SHARED = Path("/work/shared/data/rl/test")


@pytest.fixture(scope="module")
def humaneval() -> list[Example]:
    return HumanEvalTask().eval_set()


@pytest.fixture(scope="module")
def mbpp() -> list[Example]:
    return MBPPTask().eval_set()


# ----------------------------------------------------------------------------- reference solutions
# HumanEval/0 as a body continuation of the prompt (what a completion model writes).
HAS_CLOSE_BODY = """    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if abs(a - b) < threshold:
                return True
    return False
"""

# HumanEval/2 as a full function in a fenced block, with chatter around it.
TRUNCATE_FENCED = """Here is my solution:

```python
def truncate_number(number: float) -> float:
    return number - int(number)
```

It keeps the decimal part."""

# HumanEval/32: a full function that relies on the prompt's helper ``poly``.
FIND_ZERO_FENCED = """```python
def find_zero(xs: list):
    lo, hi = -1.0, 1.0
    while poly(xs, lo) * poly(xs, hi) > 0:
        lo, hi = lo * 2.0, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if poly(xs, lo) * poly(xs, mid) <= 0:
            hi = mid
        else:
            lo = mid
    return lo
```"""

# MBPP test items 0, 1 and 3, in the few-shot [BEGIN] '...' [DONE] format the prompt asks for.
REMOVE_OCC_MBPP = (
    " 'def remove_Occ(s, ch):\r\n    first = s.find(ch)\r\n    if first < 0:\r\n"
    "        return s\r\n    s = s[:first] + s[first + 1:]\r\n"
    "    last = s.rfind(ch)\r\n    if last < 0:\r\n        return s\r\n"
    "    return s[:last] + s[last + 1:]' \n[DONE] \n\n "
)
SORT_MATRIX_FENCED = "```python\ndef sort_matrix(m):\n    return sorted(m, key=sum)\n```"
FIND_VOLUME_PLAIN = "def find_Volume(l, b, h):\n    return (l * b * h) / 2\n"


def test_reference_solutions_pass(humaneval, mbpp):
    cases = [
        (humaneval[0], HAS_CLOSE_BODY),
        (humaneval[2], TRUNCATE_FENCED),
        (humaneval[32], FIND_ZERO_FENCED),
        (mbpp[0], REMOVE_OCC_MBPP),
        (mbpp[1], SORT_MATRIX_FENCED),
        (mbpp[3], FIND_VOLUME_PLAIN),
    ]
    for example, response in cases:
        score = score_example(example, response)
        assert (score.score, score.acc, score.kind) == (1.0, 1.0, "passed"), response


def test_failure_kinds(humaneval, mbpp):
    wrong = score_example(humaneval[0], "    return False\n")
    assert (wrong.score, wrong.acc, wrong.kind) == (0.0, 0.0, "wrong")
    assert score_example(mbpp[3], "def find_Volume(l, b, h):\n    return l * b * h\n").kind == "wrong"
    syntax = score_example(mbpp[1], "```python\ndef sort_matrix(m)\n    return m\n```")
    assert (syntax.score, syntax.kind) == (0.0, "error")
    # a NameError (the function is missing) is an error, not a wrong answer
    assert score_example(mbpp[1], "def sortmatrix(m):\n    return sorted(m, key=sum)\n").kind == "error"
    # leaving before the tests run earns nothing
    assert score_example(mbpp[1], "import sys\nsys.exit(0)\n").kind == "error"


def test_infinite_loop_times_out_within_bound(humaneval):
    start = time.monotonic()
    score = code_reward(humaneval[0], "    while True:\n        pass\n", timeout=1.5)
    assert (score.score, score.kind) == (0.0, "timeout")
    assert time.monotonic() - start < 6.0


# ----------------------------------------------------------------------------------- extraction
def test_extract_code():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```python\nx = 2\n```\nc") == "x = 2\n"
    assert extract_code("```py\nx = 3\n```") == "x = 3\n"
    assert extract_code("```\nx = 4\n```") == "x = 4\n"
    assert extract_code("```text\nno\n```\n```python\nx = 5\n```") == "x = 5\n"
    assert extract_code("x = 6\n") == "x = 6\n"
    assert extract_code(" 'x = 7' \n[DONE] \n\n ") == "x = 7"
    assert extract_code("[BEGIN]\n 'x = 8' \n[DONE]") == "x = 8"
    assert extract_code("") == ""


def test_body_continuation_gets_the_prompt(humaneval):
    ex = humaneval[0]
    assert entry_point_of(ex) == "has_close_elements"
    program = program_for(ex, HAS_CLOSE_BODY, "has_close_elements")
    assert program == prompt_code(ex) + HAS_CLOSE_BODY
    assert program.startswith("from typing import List\n")


def test_full_function_keeps_the_prompts_imports_and_helpers(humaneval):
    ex = humaneval[32]
    assert entry_point_of(ex) == "find_zero"
    program = program_for(ex, FIND_ZERO_FENCED, "find_zero")
    assert program.startswith("import math\n")
    assert "def poly(" in program
    assert program.endswith(extract_code(FIND_ZERO_FENCED))


def test_entry_points(humaneval):
    names = [entry_point_of(ex) for ex in humaneval]
    assert all(names)
    assert names[10] == "make_palindrome" and names[38] == "decode_cyclic"
    assert (
        entry_point_of(
            Example(
                prompt=[{"role": "user", "content": "def f(x):\n"}],
                ground_truth="",
                data_source="humaneval",
                extra_info={"entry_point": "g"},
            )
        )
        == "g"
    )


def test_other_code_formats_are_refused():
    ex = Example(
        prompt=[{"role": "user", "content": "read stdin"}],
        ground_truth=json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}),
        data_source="lcbv5",
        extra_info={"task": "code"},
    )
    with pytest.raises(UnsupportedDataSourceError, match="stdin/stdout") as info:
        score_example(ex, "print(input())")
    assert "\n" not in str(info.value)


def test_task_code_in_extra_info_selects_the_code_reward():
    ex = Example(
        prompt=[{"role": "user", "content": "write double"}],
        ground_truth=json.dumps(["assert double(2) == 4"]),
        data_source="my_code_set",
        extra_info={"task": "code"},
    )
    assert score_example(ex, "def double(x):\n    return 2 * x\n").kind == "passed"


# ------------------------------------------------------------------------------ tasks and data
@pytest.mark.parametrize(
    "cls, name, rows, source",
    [
        (HumanEvalTask, "humaneval", 164, "humaneval"),
        (HumanEvalPlusTask, "humaneval_plus", 163, "humanevalplus"),
        (MBPPTask, "mbpp", 500, "mbpp"),
    ],
)
def test_task_counts_and_splits(cls, name, rows, source):
    task = cls(TaskConfig(name=name))
    assert task.name == name
    items = task.eval_set()
    assert len(items) == rows
    assert len(task.examples("eval", limit=1000)) == rows
    assert len(task.examples("eval")) == min(rows, TaskConfig().num_eval)
    assert len(cls(TaskConfig(name=name, num_eval=7)).examples("eval")) == 7
    assert {ex.data_source for ex in items} == {source}
    assert all(ex.extra_info["task"] == "code" and ex.prompt[-1]["content"] for ex in items)
    assert [ex.extra_info["index"] for ex in items] == list(range(rows))
    with pytest.raises(DareError, match="train_path") as info:
        task.examples("train")
    assert "\n" not in str(info.value)


def test_train_split_from_a_file(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pq.read_table(DATA_DIR / "mbpp_test.parquet").slice(0, 4), path)
    task = MBPPTask(TaskConfig(name="mbpp", train_path=str(path)))
    assert len(task.examples("train")) == 4


def test_humaneval_prompts_are_the_datas(humaneval):
    for ex in humaneval:
        assert len(ex.prompt) == 1
        assert ex.prompt[0]["content"].startswith("Complete the following python code:\n")
        tests, entry = code_tests(ex)
        assert entry and "def check(candidate)" in tests


_CALL = re.compile(r"assert\s.*?([A-Za-z_]\w*)\s*\(")


def test_mbpp_tests_are_those_the_prompt_shows(mbpp):
    """The finding: the prompt is a 3-shot chat whose *first* user turn is a fixed example
    (similar_elements); the item itself is the *last* user turn, and every row's ground-truth
    asserts appear verbatim there. The grader runs exactly those asserts."""
    first_turns = {ex.prompt[0]["content"] for ex in mbpp}
    assert len(first_turns) == 1 and "similar_elements" in first_turns.pop()
    for ex in mbpp:
        roles = [m["role"] for m in ex.prompt]
        assert roles == ["user", "assistant"] * 4 and ex.prompt[-1]["content"] == "[BEGIN]\n"
        asserts = json.loads(ex.ground_truth)
        shown = ex.prompt[-2]["content"]
        assert len(asserts) >= 3
        assert all(a.strip() in shown for a in asserts)
        tests, entry = code_tests(ex)
        assert entry is None and tests == "\n".join(asserts)
    # the first row's item is remove_Occ, not the few-shot similar_elements
    assert "remove_Occ" in mbpp[0].prompt[-2]["content"]
    assert _CALL.match(json.loads(mbpp[0].ground_truth)[0]).group(1) == "remove_Occ"


@pytest.mark.skipif(not SHARED.exists(), reason="shared data not mounted")
@pytest.mark.parametrize(
    "bundled, real",
    [
        ("humaneval_test.parquet", "humaneval.parquet"),
        ("humanevalplus_test.parquet", "humanevalplus.parquet"),
        ("mbpp_test.parquet", "mbpp.parquet"),
    ],
)
def test_bundled_files_are_the_real_test_sets(bundled, real):
    assert pq.read_table(DATA_DIR / bundled).to_pylist() == pq.read_table(SHARED / real).to_pylist()


def test_humaneval_plus_runs_its_extended_tests():
    items = HumanEvalPlusTask().eval_set()
    assert "def" in items[0].prompt[0]["content"]
    assert score_example(items[0], HAS_CLOSE_BODY).kind == "passed"
    assert score_example(items[0], "    return False\n").kind == "wrong"
