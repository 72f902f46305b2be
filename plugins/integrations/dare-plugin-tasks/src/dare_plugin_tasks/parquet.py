"""Loading verl-schema data files, and the file-backed tasks (``parquet``, ``gsm8k``, ``math500``,
``humaneval``, ``humaneval_plus``, ``mbpp``).

A data file is ``.parquet`` or ``.jsonl`` (one JSON object per line) with the keys
``data_source``, ``prompt`` (chat messages, or a plain string = one user message),
``reward_model.ground_truth`` and optionally ``extra_info``. SFT files carry the reference
answer in ``extra_info.answer`` (or a top-level ``response``), which becomes
:attr:`Example.response`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from dare_core.api import DareError, Example
from dare_plugin_tasks._base import FileBackedTask

__all__ = [
    "GSM8KTask",
    "HumanEvalPlusTask",
    "HumanEvalTask",
    "MBPPTask",
    "Math500Task",
    "ParquetTask",
    "REQUIRED_COLUMNS",
    "load_examples",
    "read_rows",
]

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
_EXPECTED = "data_source, prompt, reward_model{ground_truth}, extra_info (optional)"
_JSONL_SUFFIXES = (".jsonl", ".json")


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _fail(path: str, problem: str) -> DareError:
    return DareError(f"{path}: {problem}")


def _read_parquet(
    path: str,
    limit: Optional[int],
    required: tuple[str, ...],
    optional: Optional[tuple[str, ...]],
    expected: tuple[str, str],
) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise _fail(path, f"not a readable parquet file ({_one_line(exc)})") from None
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise _fail(path, f"missing column(s) {', '.join(missing)}; expected {expected[0]} columns {expected[1]}")
    wanted = None if optional is None else [c for c in (*required, *optional) if c in schema.names]
    try:
        table = pq.read_table(path, columns=wanted)
    except (pa.ArrowException, OSError) as exc:
        raise _fail(path, f"not a readable parquet file ({_one_line(exc)})") from None
    if limit is not None:
        table = table.slice(0, limit)
    return table.to_pylist()


def _read_jsonl(
    path: str, limit: Optional[int], required: tuple[str, ...], expected: tuple[str, str]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if limit is not None and len(rows) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise _fail(path, f"line {lineno} is not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise _fail(path, f"line {lineno} is not a JSON object")
                missing = [c for c in required if c not in row]
                if missing:
                    raise _fail(
                        path,
                        f"line {lineno} is missing key(s) {', '.join(missing)}; "
                        f"expected {expected[0]} keys {expected[1]}",
                    )
                rows.append(row)
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, or not UTF-8 text
        raise _fail(path, f"not a readable UTF-8 .jsonl file ({_one_line(exc)})") from None
    return rows


def _messages(path: str, where: str, prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Iterable) and not isinstance(prompt, (bytes, dict)):
        out = []
        for msg in prompt:
            if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
                break
            out.append({"role": str(msg["role"]), "content": str(msg["content"])})
        else:
            if out:
                return out
    raise _fail(path, f"{where}: prompt must be a string or a non-empty list of {{role, content}} messages")


def _ground_truth(path: str, where: str, reward_model: Any) -> str:
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise _fail(path, f"{where}: reward_model.ground_truth is missing; expected verl-schema columns {_EXPECTED}")
    gt = reward_model["ground_truth"]
    if isinstance(gt, str):
        return gt
    if isinstance(gt, (list, dict)):
        return json.dumps(gt)
    return str(gt)


def _to_example(path: str, where: str, row: dict[str, Any]) -> Example:
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise _fail(path, f"{where}: extra_info must be a mapping")
    extra = {k: v for k, v in extra.items() if v is not None}  # parquet fills absent fields
    response = row.get("response")
    if not isinstance(response, str) or not response:
        answer = extra.get("answer")
        response = answer if isinstance(answer, str) and answer else None
    return Example(
        prompt=_messages(path, where, row.get("prompt")),
        ground_truth=_ground_truth(path, where, row.get("reward_model")),
        data_source=str(row.get("data_source") or ""),
        extra_info=extra,
        response=response,
    )


def read_rows(
    path: str,
    limit: Optional[int] = None,
    *,
    describe: str,
    required: tuple[str, ...] = (),
    optional: Optional[tuple[str, ...]] = None,
    expected: tuple[str, str] = ("", ""),
) -> tuple[list[dict[str, Any]], str]:
    """``(rows, "row" or "record")`` of a ``.parquet`` or ``.jsonl`` file (``limit``: the first
    rows only), each row holding the ``required`` keys (the columns read: ``required`` and
    ``optional``; ``None``: all). Every problem is one :class:`DareError` naming the file;
    ``describe`` says what the file should be, ``expected`` is ``(schema name, its keys)``."""
    p = Path(path)
    if not p.is_file():
        raise DareError(f"data file not found: {path} (expected {describe})")
    if limit is not None and limit < 0:
        raise DareError(f"limit must be >= 0, got {limit}")
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path, limit, required, optional, expected), "row"
    if suffix in _JSONL_SUFFIXES:
        return _read_jsonl(path, limit, required, expected), "record"
    raise _fail(path, f"unsupported file type {suffix or '(none)'!r}; use .parquet or .jsonl")


def load_examples(path: str, limit: Optional[int] = None, *, skip_unanswered: bool = False) -> list[Example]:
    """Read a verl-schema ``.parquet`` or ``.jsonl`` file into :class:`Example`\\ s.

    Raises :class:`DareError` (one line, naming the file) for a missing or unreadable file,
    missing columns or malformed rows. ``skip_unanswered`` drops rows whose ground truth is
    null or empty instead (the bundled MATH train split has four such rows).
    """
    path = str(path)
    rows, label = read_rows(
        path,
        limit,
        describe="a verl-schema .parquet or .jsonl file",
        required=REQUIRED_COLUMNS,
        optional=("extra_info", "response"),
        expected=("verl-schema", _EXPECTED),
    )
    if skip_unanswered:
        rows = [
            r
            for r in rows
            if isinstance(r.get("reward_model"), dict) and r["reward_model"].get("ground_truth") not in (None, "")
        ]
    return [_to_example(path, f"{label} {i}", row) for i, row in enumerate(rows)]


class ParquetTask(FileBackedTask):
    """Any verl-schema data: ``task.train_path`` / ``task.eval_path`` (both required when the
    split is asked for); rewards chosen per item by ``data_source``."""

    name = "parquet"
    default_eval_file = None

    def _train_path(self) -> str:
        if self.config.train_path:
            return self.config.train_path
        raise DareError(
            "task 'parquet' needs task.train_path (a verl-schema .parquet or .jsonl file) for the train split"
        )

    def _eval_path(self) -> str:
        if self.config.eval_path:
            return self.config.eval_path
        raise DareError(
            "task 'parquet' needs task.eval_path (a verl-schema .parquet or .jsonl file) for the eval split"
        )


class GSM8KTask(FileBackedTask):
    """GSM8K with the boxed-answer math reward; eval = the 1,319 test items (bundled; the first
    ``task.num_eval`` are evaluated), train = the 7,473 bundled train items or ``task.train_path``."""

    name = "gsm8k"
    default_eval_file = "gsm8k_test.parquet"
    default_train_file = "gsm8k_train.parquet"


class Math500Task(FileBackedTask):
    """MATH-500 with the boxed-answer math reward; eval = the 500 items (bundled; the first
    ``task.num_eval`` are evaluated), train = the bundled MATH train split (7,474 rows, of which
    the 7,470 with an answer are used) or ``task.train_path``."""

    name = "math500"
    default_eval_file = "math500_test.parquet"
    default_train_file = "math_train.parquet"


class AIME2024Task(FileBackedTask):
    """AIME 2024 (all 30 problems, bundled) with the boxed-answer math reward; train =
    ``task.train_path`` (required, e.g. the MATH train set)."""

    name = "aime2024"
    default_eval_file = "aime2024_test.parquet"


class AIME2025Task(AIME2024Task):
    """AIME 2025 (all 30 problems of AIME I and II, bundled), graded as :class:`AIME2024Task`."""

    name = "aime2025"
    default_eval_file = "aime2025_test.parquet"


class HumanEvalTask(FileBackedTask):
    """HumanEval (164 items, bundled) graded by running each item's ``check(candidate)`` tests;
    the prompt is the data's own ("Complete the following python code:" + the function stub).
    Train = ``task.train_path`` (required)."""

    name = "humaneval"
    default_eval_file = "humaneval_test.parquet"


class HumanEvalPlusTask(FileBackedTask):
    """HumanEval+ (EvalPlus; 163 items, bundled: HumanEval/32 ``find_zero`` is not in the file)
    graded by its extended ``check(candidate)`` tests; the prompt is the bare function stub as the
    data gives it. Train = ``task.train_path`` (required)."""

    name = "humaneval_plus"
    default_eval_file = "humanevalplus_test.parquet"


class MBPPTask(FileBackedTask):
    """MBPP (500 test items, bundled) graded by running each item's three ``assert`` lines; the
    prompt is the data's own 3-shot ``[BEGIN] … [DONE]`` chat. Train = ``task.train_path``
    (required)."""

    name = "mbpp"
    default_eval_file = "mbpp_test.parquet"
