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
import math
import operator
import re
import threading
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
_COUNTDOWN_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_MAX_EXPONENT = 64
_MAX_POW_BASE = 10**6


def _eval_arith(node: ast.AST) -> Union[int, float]:
    """Evaluate an arithmetic AST like Python's ``eval`` would, refusing anything else.

    ``**`` is evaluated only for small operands (a guard against ``9**9**9``-style hangs).
    """
    if isinstance(node, ast.Expression):
        return _eval_arith(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval_arith(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        left = _eval_arith(node.left)
        right = _eval_arith(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > _MAX_EXPONENT or abs(left) > _MAX_POW_BASE:
                raise ValueError("exponent too large")
            return left**right
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise ValueError("operator not allowed")
        return fn(left, right)
    raise ValueError("not an arithmetic expression")


def evaluate_equation(equation: str) -> Optional[float]:
    """Value of a countdown equation, or ``None`` if it has characters outside
    ``0-9 + - * / ( ) .``/whitespace or does not evaluate (syntax error, division by zero)."""
    if not _COUNTDOWN_CHARS.match(equation):
        return None
    try:
        value = _eval_arith(ast.parse(equation.strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError,
            MemoryError):
        return None
    if isinstance(value, complex):
        return None
    return value


def _parse_numbers(numbers: Any) -> list[int]:
    if isinstance(numbers, str):
        numbers = json.loads(numbers)
    return [int(n) for n in numbers]


def countdown_reward(
    response: str, numbers: Union[Sequence[int], str], target: Union[int, str]
) -> Score:
    """Rule of arXiv:2504.12216: 1.0 for a correct equation, 0.1 for a well-formed wrong one, 0 without ``<answer>``.

    ``numbers`` is a list of ints or its JSON string (``extra_info.numbers``); ``target`` an int
    or the ground-truth string. The equation must use exactly the multiset ``numbers`` and only
    ``0-9 + - * / ( ) .`` and whitespace.
    """
    nums = sorted(_parse_numbers(numbers))
    goal = int(target)
    equation = extract_answer_tag(response)
    if equation is None:
        return Score(score=0.0, acc=0.0, pred="")
    used = sorted(int(n) for n in re.findall(r"\d+", equation))
    if used != nums:
        return Score(score=0.1, acc=0.0, pred=equation)
    value = evaluate_equation(equation)
    if value is None or not abs(value - goal) < 1e-5:
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


# =========================================================================== math: Hendrycks
_ENCLOSING_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")


def _hendrycks_fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[:1] == "{":
            out += part
            continue
        if len(part) < 2:
            raise ValueError("malformed \\frac")
        a, b, rest = part[0], part[1], part[2:]
        if b != "{":
            out += "{" + a + "}{" + b + "}" + rest
        else:
            out += "{" + a + "}" + b + rest
    return out


def _hendrycks_fix_a_slash_b(s: str) -> str:
    pieces = s.split("/")
    if len(pieces) != 2:
        return s
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        return s
    if s != f"{a}/{b}":
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _hendrycks_fix_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        if part[:1] != "{":
            if not part:
                raise ValueError("malformed \\sqrt")
            out += "\\sqrt{" + part[0] + "}" + part[1:]
        else:
            out += "\\sqrt" + part
    return out


def _hendrycks_strip(s: str) -> str:
    """Hendrycks MATH ``_strip_string``; raises ``ValueError`` where the original asserts."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # units on the right
        unit_split = s.split("\\text{ ")
        if len(unit_split) != 2:
            raise ValueError("ambiguous units")
        s = unit_split[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    eq = s.split("=")
    if len(eq) == 2 and len(eq[0]) <= 2:
        s = eq[1]
    s = _hendrycks_fix_sqrt(s)
    s = s.replace(" ", "")
    s = _hendrycks_fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _hendrycks_fix_a_slash_b(s)


def _mathd_normalize(answer: str) -> str:
    answer = answer.strip()
    m = _ENCLOSING_TEXT.search(answer)
    if m is not None:
        answer = m.group("text").strip()
    try:
        return _hendrycks_strip(answer)
    except (ValueError, IndexError):
        return answer


def _grade_mathd(given: str, truth: str) -> bool:
    return _mathd_normalize(truth) == _mathd_normalize(given)


# =========================================================================== math: symbolic
_UNITS = (
    "degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
    "month", "year", "foot", "feet", "inch", "yard",
)
_UNIT_RES = [re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS]
_TUPLE_CHARS = "()[]"
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_COMMA_RE = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_PLAIN_NUMBER = re.compile(r"-?[0-9.]+")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_COMMAND = re.compile(r"\\([a-zA-Z]+)")
_GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε",
    "zeta": "ζ", "eta": "η", "theta": "θ", "vartheta": "θ", "iota": "ι", "kappa": "κ",
    "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "rho": "ρ", "sigma": "σ", "tau": "τ",
    "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω",
}
_COMMAND_TEXT = {"pi": "pi", "infty": "inf", "sqrt": "sqrt", "cdot": "*", "times": "*", "div": "/"}


def _strip_number_commas(expr: str) -> str:
    while True:
        nxt = _COMMA_RE.sub(r"\1\3\4", expr)
        if nxt == expr:
            return expr
        expr = nxt


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _str_is_int(s: str) -> bool:
    try:
        x = float(_strip_number_commas(s))
    except ValueError:
        return False
    return math.isfinite(x) and abs(x - round(x)) <= 1e-7


def _is_frac(s: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", s) is not None


def _light_normalize(expr: str) -> str:
    """DeepScaleR ``_normalize`` up to (not including) the LaTeX→text step; stays LaTeX."""
    m = _ENCLOSING_TEXT.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(word, power)
    expr = _TEXT_CMD.sub(r" \1", expr)
    for unit_re in _UNIT_RES:
        expr = unit_re.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr).replace("^{\\circ}", "")
    expr = expr.strip()
    if len(expr) > 1 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    for junk in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:"):
        expr = expr.replace(junk, "")
    expr = expr.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    try:  # \frac12 → \frac{1}{2}, \sqrt3 → \sqrt{3}
        expr = _hendrycks_fix_fracs(_hendrycks_fix_sqrt(expr))
    except (ValueError, IndexError):
        pass
    expr = expr.strip()
    if _is_float(expr) and _str_is_int(expr):
        expr = str(int(round(float(expr))))
    return _strip_number_commas(expr)


def _command_to_text(m: re.Match) -> str:
    name = m.group(1)
    if name in _COMMAND_TEXT:
        return _COMMAND_TEXT[name]
    if name in _GREEK:
        return _GREEK[name]
    return ""  # structural commands (\frac, \mathbf, ...) leave only their arguments


def _braced(s: str, i: int) -> tuple[Optional[str], int]:
    """Content of the brace group opening at ``s[i] == "{"`` and the index after it."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1 : j], j + 1
    return None, i


def _fracs_to_text(s: str) -> str:
    """``\\frac{a}{b}`` → `` a/b`` (plain numbers) or `` (a)/(b)``; ``\\sqrt{a}`` → ``sqrt(a)``."""
    out: list[str] = []
    i = 0
    while i < len(s):
        if s.startswith("\\frac{", i):
            num, j = _braced(s, i + 5)
            if num is not None and s.startswith("{", j):
                den, k = _braced(s, j)
                if den is not None:
                    a, b = _fracs_to_text(num).strip(), _fracs_to_text(den).strip()
                    if _PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(b):
                        out.append(f" {a}/{b}")
                    else:
                        out.append(f" ({a})/({b})")
                    i = k
                    continue
        if s.startswith("\\sqrt{", i):
            arg, j = _braced(s, i + 5)
            if arg is not None:
                out.append(f"sqrt({_fracs_to_text(arg)})")
                i = j
                continue
        out.append(s[i])
        i += 1
    return "".join(out)


def _to_text(expr: str) -> str:
    """The rest of DeepScaleR ``_normalize``: a plain-text, lower-case canonical form."""
    expr = _fracs_to_text(expr)
    expr = _COMMAND.sub(_command_to_text, expr)
    expr = re.sub(r"- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # mixed numbers
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(_strip_number_commas(expr))))
    return expr


def _split_tuple(expr: str) -> list[str]:
    if not expr:
        return []
    if (
        len(expr) > 2
        and expr[0] in _TUPLE_CHARS
        and expr[-1] in _TUPLE_CHARS
        and all(ch not in expr[1:-1] for ch in _TUPLE_CHARS)
    ):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def _allow_symbolic(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(r.search(expr) for r in _BAD_REGEXES)


def _symbolic_equal(truth_latex: str, given_latex: str) -> bool:
    from math_verify import parse, verify  # imported lazily: slow, and only needed here

    in_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if in_main else None  # math-verify's timeout uses SIGALRM (main thread only)
    try:
        gold = parse(f"${truth_latex}$", parsing_timeout=timeout)
        pred = parse(f"${given_latex}$", parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # any parser/sympy failure means "not shown equal"
        return False


def _grade_symbolic(given: str, truth: str) -> bool:
    truth_n = _light_normalize(truth)
    given_n = _light_normalize(given)
    if _to_text(truth_n) == _to_text(given_n):
        return True
    if not given_n:
        return False
    truth_elems = _split_tuple(truth_n)
    given_elems = _split_tuple(given_n)
    if len(truth_elems) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False
    if len(truth_elems) != len(given_elems):
        return False
    for t_elem, g_elem in zip(truth_elems, given_elems):
        t_text, g_text = _to_text(t_elem), _to_text(g_elem)
        if t_text == g_text:
            continue
        if _is_frac(t_text) and _is_frac(g_text):
            return False  # unreduced fractions must match exactly (already known unequal)
        if _str_is_int(t_text) != _str_is_int(g_text):
            return False  # an integer on exactly one side: exact match only
        if not _allow_symbolic(f"({t_text})-({g_text})"):
            return False
        if not _symbolic_equal(t_elem, g_elem):
            return False
    return True


def grade_math_answer(given: str, truth: str) -> bool:
    """``grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth)``.

    The Hendrycks MATH normalisation (arXiv:2103.03874) or the sympy check of the PRM800K grader
    (arXiv:2305.20050), in DeepScaleR's versions.
    """
    if given is None or truth is None:
        return False
    return _grade_mathd(given, truth) or _grade_symbolic(given, truth)


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
    {"humaneval", "humanevalplus", "mbpp", "lcbv5", "primeintellect", "taco", "apps",
     "code_contests", "codeforces", "livecodebench"}
)
_SUPPORTED = ("countdown, sudoku*, gsm8k, math, math500, aime*, openr1*, humaneval, "
              "humanevalplus, mbpp (and extra_info.task == 'code' with check()/assert tests)")


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
