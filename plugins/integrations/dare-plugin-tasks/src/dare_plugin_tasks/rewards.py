"""Rule-based rewards: countdown and 4×4 sudoku (Zhao et al. 2025, arXiv:2504.12216), boxed math answers,
and (through :mod:`dare_plugin_tasks.code`) executed tests for HumanEval/MBPP-style code items.

Every function returns a :class:`~dare_core.interfaces.Score`: ``score`` is the training reward,
``acc`` is 1.0 iff the answer is fully correct, ``pred`` is the extracted answer.
``response`` is the decoded completion with special tokens (and a trailing eos string) removed;
text after the last ``</answer>`` is ignored.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import threading
from fractions import Fraction
from typing import Any, Optional, Sequence, Union

from dare_core.api import DareError, Example, Score
from dare_plugin_tasks.code import CODE_SOURCES, UnsupportedCodeFormatError, code_reward

__all__ = [
    "EXTRACTION_FAILED",
    "UnsupportedDataSourceError",
    "code_reward",
    "countdown_reward",
    "evaluate_equation",
    "extract_answer_tag",
    "extract_boxed",
    "grade_math_answer",
    "math_reward",
    "score_example",
    "sudoku_reward",
]

EXTRACTION_FAILED = "ERROR: Answer Extraction Failed"

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class UnsupportedDataSourceError(DareError, ValueError):
    """``score_example`` was given a ``data_source`` without a reward rule."""


def extract_answer_tag(response: str) -> Optional[str]:
    """Stripped content of the last complete ``<answer>…</answer>`` block, or ``None``."""
    matches = _ANSWER_RE.findall(response or "")
    if not matches:
        return None
    return matches[-1].strip()


# =========================================================================== countdown
_COUNTDOWN_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _countdown_literals(tree: ast.Expression, equation: str) -> Optional[list[int]]:
    """The integer literals of ``tree``, or ``None`` if it has a node outside the allow-list:
    integer literals written as plain ASCII digits, binary ``+ - * /``, unary ``-``."""
    literals = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            text = ast.get_source_segment(equation, node)
            if type(node.value) is not int or text is None or not (text.isascii() and text.isdigit()):
                return None  # floats, 1_0, 0x1f, non-ASCII digits
            literals.append(node.value)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _COUNTDOWN_OPS:
                return None  # ** // % @ << ...
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub):
                return None
        elif not isinstance(node, (ast.Expression, ast.operator, ast.unaryop)):
            return None  # names, calls, comparisons, subscripts, tuples, ...
    return literals


def _eval_exact(node: ast.AST) -> Fraction:
    """Exact value of an allow-listed expression (``ZeroDivisionError`` on division by zero)."""
    if isinstance(node, ast.Expression):
        return _eval_exact(node.body)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_eval_exact(node.operand)
    left, right = _eval_exact(node.left), _eval_exact(node.right)
    if isinstance(node.op, ast.Div):
        return left / right  # Fraction division: exact, raises ZeroDivisionError
    return _COUNTDOWN_OPS[type(node.op)](left, right)


def _parse_countdown(equation: str) -> Optional[tuple[ast.Expression, list[int]]]:
    try:
        tree = ast.parse(equation.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    literals = _countdown_literals(tree, equation.strip())
    return None if literals is None else (tree, literals)


def evaluate_equation(equation: str) -> Optional[Fraction]:
    """Exact value of a countdown expression, or ``None`` when it is not one or has no value.

    An expression is integer literals (plain digits), binary ``+ - * /``, unary minus and
    parentheses, nothing else (no ``**``, ``//``, ``%``, decimals, names or calls). ``/`` is
    exact division; division by zero gives ``None``.
    """
    parsed = _parse_countdown(equation)
    if parsed is None:
        return None
    try:
        return _eval_exact(parsed[0])
    except (ZeroDivisionError, RecursionError):
        return None


def _parse_numbers(numbers: Any) -> list[int]:
    if isinstance(numbers, str):
        numbers = json.loads(numbers)
    return [int(n) for n in numbers]


def countdown_reward(response: str, numbers: Union[Sequence[int], str], target: Union[int, str]) -> Score:
    """Countdown rule of arXiv:2504.12216 (TinyZero's), with an allow-listed expression grammar.

    1.0 when the last ``<answer>`` block is an expression (see :func:`evaluate_equation`) that
    uses every number of ``numbers`` exactly once and no other number, and whose exact value is
    ``target``; 0.1 (the paper's format reward) for such an expression with other numbers or
    another value (or a division by zero); 0 without an ``<answer>`` block or when the block is
    not an expression of the grammar (``5**2-3``, ``2.5*4``, ``x=3``, prose). ``numbers`` is a
    list of ints or its JSON string (``extra_info.numbers``); ``target`` an int or a string.
    """
    nums = sorted(_parse_numbers(numbers))
    goal = int(target)
    equation = extract_answer_tag(response)
    if equation is None:
        return Score(score=0.0, acc=0.0, pred="")
    parsed = _parse_countdown(equation)
    if parsed is None:
        return Score(score=0.0, acc=0.0, pred=equation)
    if sorted(parsed[1]) != nums or evaluate_equation(equation) != goal:
        return Score(score=0.1, acc=0.0, pred=equation)
    return Score(score=1.0, acc=1.0, pred=equation)


# =========================================================================== sudoku
def sudoku_reward(response: str, puzzle: str, ground_truth: str) -> Score:
    """Rule of arXiv:2504.12216: fraction of the puzzle's empty cells (``'0'``) filled as in ``ground_truth``.

    The solution is the digits of the last ``<answer>`` block, padded with ``'0'`` / truncated to
    16 characters. No ``<answer>`` block or a puzzle without empty cells → 0.
    """
    answer = extract_answer_tag(response)
    if answer is None:
        return Score(score=0.0, acc=0.0, pred="")
    digits = "".join(c for c in answer if c.isascii() and c.isdigit())
    solution = digits.ljust(16, "0")[:16]
    empty = [i for i, c in enumerate(puzzle[:16]) if c == "0"]
    if not empty:
        return Score(score=0.0, acc=0.0, pred=solution)
    right = sum(1 for i in empty if i < len(ground_truth) and solution[i] == ground_truth[i])
    score = right / len(empty)
    return Score(score=score, acc=1.0 if right == len(empty) else 0.0, pred=solution)


# =========================================================================== math: extraction
def extract_boxed(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{…}`` (else the last ``\\fbox{…}``), braces balanced.

    ``None`` when there is none, when the command is not directly followed by ``{``, or when
    the braces never close.
    """
    text = text or ""
    for command in ("\\boxed", "\\fbox"):
        idx = text.rfind(command)
        if idx >= 0:
            break
    else:
        return None
    start = idx + len(command)
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


# =========================================================================== math: equivalence
_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm)\{(?P<text>[^{}]*)\}$")


def _plain_text(answer: str) -> str:
    """Whitespace removed and one ``\\text{…}`` wrapper unwrapped (the fallback comparison)."""
    answer = answer.strip()
    match = _TEXT_WRAPPER.match(answer)
    if match is not None:
        answer = match.group("text")
    return re.sub(r"\s+", "", answer)


def _timeout() -> Optional[int]:
    # math-verify's timeouts use SIGALRM, which only the main thread may set
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse_latex(answer: str) -> list:
    from math_verify import parse  # imported lazily: slow, and only needed here

    try:
        return parse(f"${answer}$", parsing_timeout=_timeout())
    except Exception:  # any parser/sympy failure means "no expression"
        return []


def _relations(expr: Any) -> list:
    """The relations (``=``, ``<``, ``\\ne``, ``\\land``, ...) anywhere inside a parsed answer."""
    from sympy import Basic, preorder_traversal
    from sympy.core.relational import Relational
    from sympy.logic.boolalg import BooleanFunction

    if not isinstance(expr, Basic):
        return []
    return [node for node in preorder_traversal(expr) if isinstance(node, (Relational, BooleanFunction))]


def _is_assignment(relation: Any) -> bool:
    """``x = value``: a symbol on the left that the right side (no relation itself) does not use."""
    from sympy import Eq, Symbol

    return (
        isinstance(relation, Eq)
        and isinstance(relation.lhs, Symbol)
        and relation.lhs not in relation.rhs.free_symbols
        and not _relations(relation.rhs)
    )


def _relation_refused(gold: list, pred: list) -> bool:
    """Whether ``pred`` states a relation where ``gold`` (a value) has none.

    math-verify compares an equation's right side with a value, so ``5=7`` would equal 7; here
    only an assignment to a single symbol (``x = 7``) stands for its value.
    """
    if _relations(gold[0]):
        return False
    found = _relations(pred[0])
    return bool(found) and not (len(found) == 1 and found[0] is pred[0] and _is_assignment(pred[0]))


def grade_math_answer(given: str, truth: str) -> bool:
    """Whether ``given`` equals ``truth``, both LaTeX answers (the content of a ``\\boxed{}``).

    Equal strings (whitespace aside) are equal; otherwise both are parsed and compared by
    math-verify (its ``parse``/``verify``: numbers, fractions, radicals, sets, intervals,
    tuples, matrices up to symbolic simplification, so ``\\frac{10}{2}`` equals 5). A
    relation is an answer only where the truth is one: ``5=7``, ``a+b=7`` or ``7>5`` never
    equal 7, an assignment to one symbol (``x=7``) does. When math-verify finds no expression
    on either side, the texts must match after unwrapping a ``\\text{}``.
    """
    if given is None or truth is None or not given.strip():
        return False
    if _plain_text(given) == _plain_text(truth):
        return True
    gold, pred = _parse_latex(truth), _parse_latex(given)
    if not gold or not pred:
        return False
    if _relation_refused(gold, pred):
        return False
    from math_verify import verify

    try:
        return bool(verify(gold, pred, timeout_seconds=_timeout()))
    except Exception:  # any sympy failure means "not shown equal"
        return False


def math_reward(response: str, ground_truth: Union[str, Sequence[str]]) -> Score:
    """Math reward: 1 iff the last ``\\boxed{}`` answer equals (one of) the ground truth(s).

    A ground truth containing ``\\boxed`` is reduced to its boxed content first. No boxed answer
    in ``response`` → score 0 with ``pred = "ERROR: Answer Extraction Failed"``.
    """
    answer = extract_boxed(response)
    if answer is None:
        return Score(score=0.0, acc=0.0, pred=EXTRACTION_FAILED)
    truths = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
    for truth in truths:
        truth = str(truth)
        if "\\boxed" in truth or "\\fbox" in truth:
            truth = extract_boxed(truth)
            if truth is None:
                continue
        if grade_math_answer(answer, truth):
            return Score(score=1.0, acc=1.0, pred=answer)
    return Score(score=0.0, acc=0.0, pred=answer)


# =========================================================================== dispatch
_MATH_SOURCES = frozenset({"gsm8k", "math", "math500", "hendrycks_math", "competition_math"})
_CODE_SOURCES = frozenset(
    {
        "humaneval",
        "humanevalplus",
        "mbpp",
        "lcbv5",
        "primeintellect",
        "taco",
        "apps",
        "code_contests",
        "codeforces",
        "livecodebench",
    }
)
_SUPPORTED = (
    "countdown, sudoku*, gsm8k, math, math500, aime*, openr1*, humaneval, "
    "humanevalplus, mbpp (and extra_info.task == 'code' with check()/assert tests)"
)


def _is_math_source(key: str) -> bool:
    base = key.rsplit("/", 1)[-1]
    return base in _MATH_SOURCES or base.startswith("aime") or "openr1" in key


def score_example(example: Example, response: str) -> Score:
    """Reward of ``response`` for ``example``, chosen by ``example.data_source``.

    Code items (``humaneval``, ``humanevalplus``, ``mbpp``, other code sources and
    ``extra_info.task == "code"``) are run against their tests (:func:`code_reward`).
    Raises :class:`UnsupportedDataSourceError` (a ``ValueError``) for sources without a rule and
    for code items whose tests are in another format (e.g. stdin/stdout).
    """
    source = example.data_source or ""
    key = source.lower()
    info = example.extra_info or {}
    if key == "countdown":
        if "numbers" not in info:
            raise ValueError("countdown example has no extra_info['numbers'] (JSON list of ints)")
        return countdown_reward(response, info["numbers"], example.ground_truth)
    if key.startswith("sudoku"):
        if "puzzle" not in info:
            raise ValueError("sudoku example has no extra_info['puzzle'] (16-digit string)")
        return sudoku_reward(response, str(info["puzzle"]), str(example.ground_truth))
    if _is_math_source(key):
        return math_reward(response, example.ground_truth)
    base = key.rsplit("/", 1)[-1]
    if base in CODE_SOURCES or base in _CODE_SOURCES or info.get("task") == "code":
        try:
            return code_reward(example, response)
        except UnsupportedCodeFormatError as exc:
            raise UnsupportedDataSourceError(f"{exc}; supported data sources: {_SUPPORTED}") from None
    raise UnsupportedDataSourceError(
        f"unsupported data_source {source!r}: no reward rule; supported data sources: {_SUPPORTED}"
    )
