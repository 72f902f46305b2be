"""The ``multiple_choice`` task: MMLU / ARC / HellaSwag-style items from a local file, scored by
likelihood (:func:`dare_objectives.likelihood.choose`) or, in the generation path, by comparing
the response with the right choice.

A data file is ``.parquet`` or ``.jsonl`` with, per item, the context in ``question``, ``context``
or ``prompt`` (a string, or chat messages), ``choices`` (a non-empty list of strings) and
``answer`` (the right choice's 0-based index, or its text). Each item becomes an
:class:`~dare_core.api.Example` with ``ground_truth`` = the right choice's text and
``extra_info = {"choices": [...], "answer_index": i, "index": row}``.
"""

from __future__ import annotations

from typing import Any, Optional

from dare_core.api import DareError, Example, Score, TaskConfig
from dare_plugin_tasks._base import check_limit, copy_examples, normalize_split
from dare_plugin_tasks.parquet import read_rows

CONTEXT_KEYS = ("question", "context", "prompt")


def _example(path: str, i: int, row: dict[str, Any]) -> Example:
    where = f"{path}: item {i}"
    key = next((k for k in CONTEXT_KEYS if row.get(k) is not None), None)
    if key is None:
        raise DareError(f"{where} has no context; give one of the fields {', '.join(CONTEXT_KEYS)}")
    context = row[key]
    if isinstance(context, str):
        prompt = [{"role": "user", "content": context}]
    elif (
        isinstance(context, list)
        and context
        and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in context)
    ):
        prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in context]
    else:
        raise DareError(f"{where}: {key} must be a string or a non-empty list of {{role, content}} messages")
    choices = row.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise DareError(f"{where}: choices must be a non-empty list of strings")
    answer = row.get("answer")
    if isinstance(answer, bool) or answer is None:
        index = -1
    elif isinstance(answer, int):
        index = answer if 0 <= answer < len(choices) else -1
    else:
        index = choices.index(str(answer)) if str(answer) in choices else -1
    if index < 0:
        raise DareError(f"{where}: answer {answer!r} is neither an index below {len(choices)} nor one of the choices")
    return Example(
        prompt=prompt,
        ground_truth=choices[index],
        data_source="multiple_choice",
        extra_info={"choices": list(choices), "answer_index": index, "index": i},
        response=choices[index],
    )


def load_choices(path: str, limit: Optional[int] = None) -> list[Example]:
    """The items of a multiple-choice file (see the module docstring); one-line errors name the file."""
    rows, _ = read_rows(str(path), limit, describe="a .parquet or .jsonl file with question, choices and answer fields")
    return [_example(path, i, row) for i, row in enumerate(rows)]


def _normal(text: str) -> str:
    return " ".join(text.split()).strip(" .").lower()


class MultipleChoiceTask:
    """Items from ``task.eval_path`` / ``task.train_path``, in file order (``seed`` does not
    reorder them). ``score``: a generated response earns 1 when it equals the right choice's text
    up to whitespace, case and a final period; the likelihood path picks a choice with
    :func:`dare_objectives.likelihood.choose`, right when it is ``extra_info["answer_index"]``."""

    name = "multiple_choice"

    def __init__(self, config: Optional[TaskConfig] = None):
        self.config = config if config is not None else TaskConfig(name=self.name)
        self._cache: dict[str, list[Example]] = {}

    def _items(self, split: str) -> list[Example]:
        path = self.config.eval_path if split == "eval" else self.config.train_path
        if not path:
            field = "eval_path" if split == "eval" else "train_path"
            raise DareError(
                f"task 'multiple_choice' needs task.{field} (a .parquet or .jsonl file with "
                f"question, choices and answer fields) for the {split} split"
            )
        if split not in self._cache:
            self._cache[split] = load_choices(path)
        return self._cache[split]

    def examples(self, split: str, limit: Optional[int] = None, seed: int = 0) -> list[Example]:
        split = normalize_split(split)
        check_limit(limit)
        if split == "eval" and limit is None:
            limit = self.config.num_eval
        return copy_examples(self._items(split)[:limit])

    def score(self, example: Example, response: str) -> Score:
        acc = float(_normal(response) == _normal(example.ground_truth))
        return Score(score=acc, acc=acc, pred=response.strip())
