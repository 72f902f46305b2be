"""The core's default task plugin: sudoku, countdown, gsm8k, math500, aime2024, aime2025,
humaneval(_plus), mbpp, multiple_choice and generic parquet."""

from __future__ import annotations

from dare_core.api import TaskSpec, hookimpl, lazy
from dare_plugin_tasks.countdown import CountdownTask
from dare_plugin_tasks.parquet import (
    AIME2024Task,
    AIME2025Task,
    GSM8KTask,
    HumanEvalPlusTask,
    HumanEvalTask,
    Math500Task,
    MBPPTask,
    ParquetTask,
)
from dare_plugin_tasks.sudoku import SudokuTask


@hookimpl
def dare_register_tasks(register) -> None:
    register(
        TaskSpec(
            name="sudoku",
            build=SudokuTask,
            max_score=1.0,
            description="4x4 Sudoku, partial-credit reward; train = 20,000 bundled puzzles "
            "(task.train_path=generated: generated unique puzzles), eval = 500 real test puzzles.",
        )
    )
    register(
        TaskSpec(
            name="countdown",
            build=CountdownTask,
            max_score=1.0,
            description="Countdown (1.0 / 0.1 format / 0); train = 20,000 bundled 3-4 number items "
            "(task.train_path=generated: generated 3-number items), eval = 256 real test items.",
        )
    )
    register(
        TaskSpec(
            name="gsm8k",
            build=GSM8KTask,
            max_score=1.0,
            description="GSM8K, boxed-answer math reward; eval = 1,319 bundled test items, "
            "train = 7,473 bundled items.",
        )
    )
    register(
        TaskSpec(
            name="math500",
            build=Math500Task,
            max_score=1.0,
            description="MATH-500, boxed-answer math reward; eval = 500 bundled items, "
            "train = the bundled MATH train split (7,470 items).",
        )
    )
    register(
        TaskSpec(
            name="aime2024",
            build=AIME2024Task,
            max_score=1.0,
            description="AIME 2024, boxed-answer math reward; eval = the 30 bundled problems, "
            "train needs task.train_path.",
        )
    )
    register(
        TaskSpec(
            name="aime2025",
            build=AIME2025Task,
            max_score=1.0,
            description="AIME 2025 (I and II), boxed-answer math reward; eval = the 30 bundled problems, "
            "train needs task.train_path.",
        )
    )
    register(
        TaskSpec(
            name="humaneval",
            build=HumanEvalTask,
            max_score=1.0,
            description="HumanEval, sandboxed check() tests; prompt = the data's 'Complete the following "
            "python code:' + stub; eval = 164 bundled items, train needs task.train_path.",
        )
    )
    register(
        TaskSpec(
            name="humaneval_plus",
            build=HumanEvalPlusTask,
            max_score=1.0,
            description="HumanEval+ (EvalPlus tests), sandboxed; prompt = the data's bare stub; "
            "eval = 163 bundled items, train needs task.train_path.",
        )
    )
    register(
        TaskSpec(
            name="mbpp",
            build=MBPPTask,
            max_score=1.0,
            description="MBPP, sandboxed assert tests; prompt = the data's 3-shot [BEGIN]/[DONE] chat; "
            "eval = 500 bundled test items, train needs task.train_path.",
        )
    )
    register(
        TaskSpec(
            name="multiple_choice",
            build=lazy("dare_plugin_tasks.multiple_choice:MultipleChoiceTask"),
            max_score=1.0,
            description="Multiple choice from task.eval_path (.parquet/.jsonl: question, choices, answer); "
            "scored by likelihood (dare_objectives.likelihood.choose) or by the generated choice text.",
        )
    )
    register(
        TaskSpec(
            name="parquet",
            build=ParquetTask,
            max_score=1.0,
            description="Any verl-schema parquet/jsonl (task.train_path / task.eval_path), reward by data_source.",
        )
    )
