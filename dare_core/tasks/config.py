"""The ``task:`` section of the run configuration."""

from __future__ import annotations

from typing import Any, Optional

import attrs


def _positive(_inst: Any, _attr: Any, value: Any) -> None:
    # Kept local (not dare_core.config.validators): dare_core.config imports this module.
    if value is None or value <= 0:
        raise ValueError(f"must be > 0, got {value!r}")


def _one_of(*choices: str):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")

    return check


@attrs.frozen
class TaskConfig:
    """Which task (dataset + reward rule) a run uses, and where its data comes from."""

    name: str = attrs.field(
        default="sudoku",
        metadata={
            "help": "Task name (a registered task: sudoku, countdown, gsm8k, math500, parquet, ...)."
        },
    )
    train_path: Optional[str] = attrs.field(
        default=None,
        metadata={
            "help": "Training data: a verl-schema .parquet or .jsonl file; "
            "null = the task's built-in source (generated puzzles for sudoku/countdown)."
        },
    )
    eval_path: Optional[str] = attrs.field(
        default=None,
        metadata={
            "help": "Held-out data: a verl-schema .parquet or .jsonl file; "
            "null = the task's bundled test set."
        },
    )
    num_eval: int = attrs.field(
        default=200,
        validator=_positive,
        metadata={"help": "Number of held-out items evaluated (the first N of the eval set)."},
    )
    reward: str = attrs.field(
        default="score",
        validator=_one_of("score", "acc"),
        metadata={
            "help": "The RL reward: score = the task's own reward (partial credit where the task "
            "defines it, e.g. the fraction of Sudoku cells filled correctly), acc = exact "
            "correctness (1 or 0). Partial credit can reinforce near misses: on the bundled "
            "Sudoku checkpoints a policy-gradient step on the cell reward lowers the exact-solve "
            "rate (docs/results.md). Evaluations always report both."
        },
    )
    seed: int = attrs.field(
        default=0,
        metadata={"help": "Seed of the generated training items (sudoku/countdown)."},
    )
