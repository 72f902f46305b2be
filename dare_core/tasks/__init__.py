"""Tasks: datasets in the verl schema plus their rule-based rewards (:mod:`dare_core.tasks.rewards`)."""

from dare_core.tasks.config import TaskConfig
from dare_core.tasks.countdown import CountdownTask, generate_countdown
from dare_core.tasks.parquet import GSM8KTask, Math500Task, ParquetTask, load_examples
from dare_core.tasks.rewards import (
    EXTRACTION_FAILED,
    UnsupportedDataSourceError,
    countdown_reward,
    math_reward,
    score_example,
    sudoku_reward,
)
from dare_core.tasks.sudoku import SudokuTask, generate_sudoku

__all__ = [
    "EXTRACTION_FAILED", "CountdownTask", "GSM8KTask", "Math500Task", "ParquetTask",
    "SudokuTask", "TaskConfig", "UnsupportedDataSourceError", "countdown_reward",
    "generate_countdown", "generate_sudoku", "load_examples", "math_reward", "score_example",
    "sudoku_reward",
]
