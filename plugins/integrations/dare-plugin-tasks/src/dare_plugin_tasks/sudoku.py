"""4×4 Sudoku: a procedural puzzle generator and the ``sudoku`` task.

Eval = the real test puzzles (``data/sudoku_test.parquet``, 500 items, 8 empty cells each).
Train = the bundled train split (``data/sudoku_train.parquet``, 20,000 puzzles, 9 empty cells
each, none an eval puzzle), or with ``task.train_path=generated`` generated puzzles with a unique
solution, none of which is an eval puzzle.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Iterable, Optional, Union

from dare_core.api import DareError, Example, TaskConfig
from dare_plugin_tasks._base import FileBackedTask

__all__ = [
    "SUDOKU_PROMPT",
    "SUDOKU_REASONING",
    "SudokuTask",
    "count_solutions",
    "generate_sudoku",
    "solution_grids",
    "sudoku_example",
    "sudoku_prompt",
    "sudoku_reference_response",
]

SUDOKU_PROMPT = (
    "Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character "
    "string reading left-to-right, top-to-bottom, where '0' represents empty cells.\n\n"
    "Rules:\n"
    "- Fill empty cells with digits 1-4\n"
    "- Each row must contain digits 1-4 exactly once\n"
    "- Each column must contain digits 1-4 exactly once\n"
    "- Each 2x2 box must contain digits 1-4 exactly once\n\n"
    "Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, "
    "representing your final solved grid.\n\n"
    "Respond in this exact format:\n"
    "<reasoning>\n"
    "Your step-by-step solving process\n"
    "</reasoning>\n"
    "<answer>\n"
    "[16-character solution string with no spaces or separators]\n"
    "</answer>\n\n\n"
    "Solve the following Sudoku puzzle: {puzzle}\n"
)

SUDOKU_REASONING = "Fill the empty cells."

DEFAULT_TRAIN_SIZE = 20000
MAX_BLANKS = 12  # a 4×4 Sudoku needs at least 4 givens to have a unique solution


def sudoku_prompt(puzzle: str) -> list[dict[str, str]]:
    """The chat messages of the real data for ``puzzle`` (16 digits, ``0`` = empty)."""
    return [{"role": "user", "content": SUDOKU_PROMPT.format(puzzle=puzzle)}]


def sudoku_reference_response(solution: str) -> str:
    """The supervised target: short fixed reasoning, then the 16-digit solution."""
    return f"<reasoning>\n{SUDOKU_REASONING}\n</reasoning>\n<answer>\n{solution}\n</answer>"


@lru_cache(maxsize=1)
def solution_grids() -> tuple[str, ...]:
    """All 288 valid 4×4 Sudoku grids as 16-digit strings, in lexicographic order."""
    grids: list[str] = []
    cells = [0] * 16

    def fill(i: int) -> None:
        if i == 16:
            grids.append("".join(map(str, cells)))
            return
        r, c = divmod(i, 4)
        br, bc = r // 2 * 2, c // 2 * 2
        used = {cells[r * 4 + k] for k in range(c)}
        used |= {cells[k * 4 + c] for k in range(r)}
        used |= {cells[(br + a) * 4 + bc + b] for a in range(2) for b in range(2) if (br + a) * 4 + bc + b < i}
        for d in range(1, 5):
            if d not in used:
                cells[i] = d
                fill(i + 1)
        cells[i] = 0

    fill(0)
    return tuple(grids)


@lru_cache(maxsize=1)
def _cell_masks() -> tuple[tuple[int, ...], ...]:
    """``masks[cell][digit]``: bit ``g`` set iff grid ``g`` has ``digit`` at ``cell``."""
    grids = solution_grids()
    masks = [[0] * 5 for _ in range(16)]
    for g, grid in enumerate(grids):
        for cell, ch in enumerate(grid):
            masks[cell][int(ch)] |= 1 << g
    return tuple(tuple(m) for m in masks)


def count_solutions(puzzle: str) -> int:
    """Number of valid grids consistent with ``puzzle`` (brute force over all 288 grids)."""
    if len(puzzle) != 16 or any(ch not in "01234" for ch in puzzle):
        raise ValueError(f"a 4x4 puzzle is 16 digits 0-4, got {puzzle!r}")
    masks = _cell_masks()
    alive = (1 << len(solution_grids())) - 1
    for cell, ch in enumerate(puzzle):
        if ch != "0":
            alive &= masks[cell][int(ch)]
    return bin(alive).count("1")


def sudoku_example(puzzle: str, solution: str, index: int, split: str = "train") -> Example:
    """An :class:`Example` in the real data's layout, with a reference response."""
    return Example(
        prompt=sudoku_prompt(puzzle),
        ground_truth=solution,
        data_source="sudoku",
        extra_info={"index": index, "puzzle": puzzle, "split": split, "task": "math"},
        response=sudoku_reference_response(solution),
    )


def generate_sudoku(
    n: int,
    seed: Union[int, str] = 0,
    *,
    blanks: int = 8,
    exclude: Iterable[str] = (),
    unique: bool = True,
    split: str = "train",
) -> list[Example]:
    """``n`` distinct puzzles with ``blanks`` empty cells, deterministic for ``seed``.

    A puzzle is a uniformly drawn valid grid with ``blanks`` uniformly drawn cells emptied,
    redrawn until it has exactly one solution (``unique``) and is neither in ``exclude`` nor
    already generated.
    """
    if not 1 <= blanks <= MAX_BLANKS:
        raise DareError(f"sudoku blanks must be in [1, {MAX_BLANKS}], got {blanks}")
    rng = random.Random(f"sudoku:{seed}")
    grids = solution_grids()
    seen = set(exclude)
    out: list[Example] = []
    misses = 0
    while len(out) < n:
        grid = grids[rng.randrange(len(grids))]
        holes = set(rng.sample(range(16), blanks))
        puzzle = "".join("0" if i in holes else ch for i, ch in enumerate(grid))
        if puzzle in seen or (unique and count_solutions(puzzle) != 1):
            misses += 1
            if misses > 1000 + 50 * n:
                raise DareError(
                    f"could not generate {n} distinct sudoku puzzles with {blanks} blanks; "
                    f"use fewer blanks or a smaller limit"
                )
            continue
        seen.add(puzzle)
        out.append(sudoku_example(puzzle, grid, index=len(out), split=split))
    return out


class SudokuTask(FileBackedTask):
    """4×4 Sudoku with partial-credit reward (the cell reward of arXiv:2504.12216).

    ``examples("eval")``: the real test puzzles (or ``config.eval_path``).
    ``examples("train")``: ``config.train_path`` if set, else the bundled train split; items
    without a response get the reference response built from their solution. With
    ``train_path=generated``: ``limit`` (default 20000) generated puzzles, deterministic for
    ``(config.seed, seed)``, excluding every eval puzzle.
    """

    name = "sudoku"
    default_eval_file = "sudoku_test.parquet"
    default_train_file = "sudoku_train.parquet"
    generates = True

    def __init__(self, config: Optional[TaskConfig] = None, *, blanks: int = 8):
        super().__init__(config)
        if not 1 <= blanks <= MAX_BLANKS:
            raise DareError(f"sudoku blanks must be in [1, {MAX_BLANKS}], got {blanks}")
        self.blanks = blanks

    def _complete(self, items: list[Example]) -> list[Example]:
        for ex in items:
            gt = str(ex.ground_truth)
            if ex.response is None and len(gt) == 16 and gt.isdigit():
                ex.response = sudoku_reference_response(gt)
        return items

    def _generate_train(self, limit: Optional[int], seed: int) -> list[Example]:
        n = DEFAULT_TRAIN_SIZE if limit is None else limit
        exclude = {str(ex.extra_info.get("puzzle", "")) for ex in self.eval_set()}
        return generate_sudoku(n, seed=f"{self.config.seed}:{seed}", blanks=self.blanks, exclude=exclude)
