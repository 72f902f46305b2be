"""Code reward: run the program in a response against an item's tests (HumanEval, MBPP).

The program is taken from the response the way the HumanEval/MBPP evaluations do it: the last
fenced ```` ```python ```` block (else the last bare ```` ``` ```` block), else the whole text,
with MBPP's few-shot ``[BEGIN] '…' [DONE]`` wrapping removed. For HumanEval-style items (tests
define ``check(candidate)``) the prompt's code is put in front: when the extracted code defines
the entry point it redefines the prompt's stub (the prompt still supplies imports and helper
functions such as ``poly`` or ``encode_cyclic``); otherwise the response is taken as the body
continuation of the prompt's last function. The program then runs in
:func:`dare_plugin_tasks.sandbox.check_program`, the tests in a separate checker process that
gets the candidate's results by value (a HumanEval prompt's helpers such as ``poly`` are taken
from the prompt there, not from the response); ``Score.kind`` is the outcome
(``passed``, ``wrong``, ``error``, ``timeout``, ``memory`` or ``killed``) and ``Score.pred`` is
empty (a program is no answer to vote on).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

from dare_core.api import DareError, Example, Score

__all__ = [
    "CODE_SOURCES",
    "CODE_TIMEOUT",
    "HUMANEVAL_PREFIX",
    "UnsupportedCodeFormatError",
    "code_reward",
    "code_tests",
    "entry_point_of",
    "extract_code",
    "program_for",
    "prompt_code",
]

CODE_SOURCES = frozenset({"humaneval", "humanevalplus", "mbpp"})
CODE_TIMEOUT = 10.0
HUMANEVAL_PREFIX = "Complete the following python code:\n"


class UnsupportedCodeFormatError(DareError, ValueError):
    """A code item whose tests are neither HumanEval ``check()`` code nor MBPP assert lines."""


_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PY_TAGS = frozenset({"python", "python3", "py"})


def extract_code(response: str) -> str:
    """The program in ``response``: last ```` ```python ```` block, else last bare fenced
    block, else the whole text (with an MBPP ``[BEGIN] '…' [DONE]`` wrapping removed)."""
    text = response or ""
    blocks = _FENCE_RE.findall(text)
    tagged = [body for tag, body in blocks if tag.lower() in _PY_TAGS]
    if tagged:
        return tagged[-1]
    bare = [body for tag, body in blocks if not tag]
    if bare:
        return bare[-1]
    if "[DONE]" in text:
        text = text.split("[DONE]", 1)[0]
    if "[BEGIN]" in text:
        text = text.rsplit("[BEGIN]", 1)[1]
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] == "'":
        return stripped[1:-1]
    return text


def prompt_code(example: Example) -> str:
    """The code of the item's prompt (its last user turn, HumanEval's instruction line removed)."""
    users = [m["content"] for m in example.prompt if m.get("role") == "user"]
    text = users[-1] if users else ""
    if text.startswith(HUMANEVAL_PREFIX):
        text = text[len(HUMANEVAL_PREFIX) :]
    return text


_DEF_RE = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def entry_point_of(example: Example) -> Optional[str]:
    """``extra_info.entry_point``, else the last top-level function the prompt's code defines."""
    given = (example.extra_info or {}).get("entry_point")
    if isinstance(given, str) and given.isidentifier():
        return given
    code = prompt_code(example)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        names = _DEF_RE.findall(code)
        return names[-1] if names else None
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names[-1] if names else None


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def code_tests(example: Example) -> tuple[str, Optional[str]]:
    """``(tests, entry_point)`` of a code item.

    A ground truth defining ``check(candidate)`` is HumanEval-style (entry point from
    :func:`entry_point_of`); a JSON list of strings is MBPP-style assert lines (no entry point).
    """
    truth = example.ground_truth
    if isinstance(truth, str) and re.search(r"^def\s+check\s*\(", truth, re.MULTILINE):
        entry = entry_point_of(example)
        if entry is None:
            raise DareError(
                f"{example.data_source} item has check() tests but no entry point "
                f"(no extra_info.entry_point and no def in the prompt)"
            )
        return truth, entry
    try:
        parsed: Any = json.loads(truth) if isinstance(truth, str) else truth
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, list) and parsed and all(isinstance(t, str) for t in parsed):
        return "\n".join(parsed), None
    raise UnsupportedCodeFormatError(
        f"code data_source {example.data_source!r}: the ground truth is neither HumanEval "
        f"check() code nor a JSON list of assert strings (stdin/stdout tests are not supported yet)"
    )


def program_for(example: Example, response: str, entry_point: Optional[str]) -> str:
    """The program to run: the extracted code, completed with the prompt's code when the
    item is HumanEval-style (see the module docstring)."""
    code = extract_code(response)
    if entry_point is None:
        return code
    prefix = prompt_code(example)
    if _defines(code, entry_point):
        return prefix.rstrip("\n") + "\n\n\n" + code
    return prefix + code


def code_reward(example: Example, response: str, *, timeout: float = CODE_TIMEOUT) -> Score:
    """1.0 iff the response's program passes the item's tests within ``timeout`` seconds;
    ``kind`` is the sandbox outcome (``passed``/``wrong``/``error``/``timeout``/...)."""
    from dare_plugin_tasks.sandbox import check_program

    tests, entry = code_tests(example)
    program = program_for(example, response, entry)
    context = prompt_code(example) if entry is not None else None
    result = check_program(program, tests, entry, context=context, timeout=timeout)
    ok = 1.0 if result.status == "passed" else 0.0
    return Score(score=ok, acc=ok, kind=result.status)
