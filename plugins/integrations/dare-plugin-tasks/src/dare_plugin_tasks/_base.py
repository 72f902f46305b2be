"""Shared machinery of the built-in tasks: split handling, bundled files, example copies."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Optional

from dare_core.api import DareError, Example, Score, TaskConfig
from dare_plugin_tasks.rewards import score_example

DATA_DIR = Path(__file__).resolve().parent / "data"

_SPLITS = {"train": "train", "eval": "eval", "test": "eval"}


def bundled(filename: str) -> str:
    """Path of a data file shipped in this package's ``data/``."""
    return str(DATA_DIR / filename)


def normalize_split(split: str) -> str:
    try:
        return _SPLITS[split]
    except (KeyError, TypeError):
        raise DareError(f"unknown split {split!r}; use 'train' or 'eval'") from None


def check_limit(limit: Optional[int]) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise DareError(f"limit must be a non-negative integer or None, got {limit!r}")


def copy_examples(items: list[Example]) -> list[Example]:
    """Fresh copies, so callers may mutate what they get without touching a cache."""
    return [
        Example(
            prompt=[dict(m) for m in ex.prompt],
            ground_truth=ex.ground_truth,
            data_source=ex.data_source,
            extra_info=copy.deepcopy(ex.extra_info),
            response=ex.response,
        )
        for ex in items
    ]


GENERATED = "generated"  # task.train_path value selecting a task's puzzle generator


class FileBackedTask:
    """A task whose splits come from files; subclasses add built-in sources.

    ``examples("eval")`` returns the first ``limit`` (default ``config.num_eval``) items of the
    eval file in file order; ``examples("train")`` the first ``limit`` (default all) items of
    the train file: ``task.train_path``, else the bundled train split (``default_train_file``).
    ``task.train_path=generated`` selects the task's generator where it has one
    (``generates``) and means the same as null elsewhere, so a checkpoint's defaults may set it
    for every task. ``seed`` does not reorder file-backed splits (the trainer shuffles).
    """

    name = "file"
    default_eval_file: Optional[str] = None  # a file under data/
    default_train_file: Optional[str] = None  # a file under data/
    generates = False  # True: task.train_path=generated draws items from _generate_train

    def __init__(self, config: Optional[TaskConfig] = None):
        self.config = config if config is not None else TaskConfig(name=self.name)
        self._cache: dict[str, list[Example]] = {}

    # -- sources ------------------------------------------------------------------------
    def _eval_path(self) -> str:
        if self.config.eval_path:
            return self.config.eval_path
        if self.default_eval_file is None:
            raise DareError(
                f"task {self.name!r} has no bundled eval set; set task.eval_path to a "
                f"verl-schema .parquet or .jsonl file"
            )
        return bundled(self.default_eval_file)

    def _train_path(self) -> str:
        path = self.config.train_path
        if path and path != GENERATED:  # a task without a generator reads `generated` as null
            return path
        if self.default_train_file is None:
            raise DareError(
                f"task {self.name!r} has no built-in training data; set task.train_path to a "
                f"verl-schema .parquet or .jsonl file"
            )
        return bundled(self.default_train_file)

    def _load(self, key: str, path_fn: Callable[[], str]) -> list[Example]:
        if key not in self._cache:
            from dare_plugin_tasks.parquet import load_examples

            path = path_fn()
            bundled_file = key == "train" and not self.config.train_path
            self._cache[key] = load_examples(path, skip_unanswered=bundled_file)
        return self._cache[key]

    def eval_set(self) -> list[Example]:
        """The whole eval file (cached; do not mutate)."""
        return self._load("eval", self._eval_path)

    def _generate_train(self, limit: Optional[int], seed: int) -> list[Example]:
        raise NotImplementedError  # tasks with generates = True define it

    def _complete(self, items: list[Example]) -> list[Example]:
        """Fill what a task can derive for file items (e.g. a reference response); in place."""
        return items

    # -- Task protocol --------------------------------------------------------------------
    def examples(self, split: str, limit: Optional[int] = None, seed: int = 0) -> list[Example]:
        split = normalize_split(split)
        check_limit(limit)
        if split == "eval":
            n = self.config.num_eval if limit is None else limit
            return copy_examples(self.eval_set()[:n])
        if self.generates and self.config.train_path == GENERATED:
            return self._generate_train(limit, seed)
        return self._complete(copy_examples(self._load("train", self._train_path)[:limit]))

    def score(self, example: Example, response: str) -> Score:
        return score_example(example, response)
