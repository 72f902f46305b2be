"""A fresh held-out set of generated 4×4 Sudoku puzzles, disjoint from the training pools.

    python research/heldout_sudoku.py --n 2000 --train-seeds 0-4 --seed 0 --out heldout0.jsonl

The real test set has 500 puzzles; a paired comparison on them resolves about ±2 points. This
draws ``--n`` further puzzles like the training ones (``--blanks`` empty cells, exactly one
solution) from the generator under its own seed, excluding every puzzle of the real test set and
of the training pools that runs with ``seed`` in ``--train-seeds`` (and ``task.seed``
``--task-seed``) draw from (``task.train_path=generated``: 20,000 puzzles per run seed), so no RL or
SFT run of those seeds has trained on them (the bundled train split has 9 empty cells per puzzle, so
an 8-blank puzzle is never one of its puzzles). Written as verl-schema JSON lines, for
``task.eval_path=FILE``. Bad input is one ``error:`` line.
"""

from __future__ import annotations

import argparse
import json

from dare_core.api import DareError, TaskConfig, atomic_write_text, run_script
from dare_plugin_tasks.sudoku import SudokuTask, count_solutions, generate_sudoku


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise DareError(f"--train-seeds takes seeds like 0-4 or 0,2,5, got {text!r}") from None
    return out


def _row(ex) -> dict:
    """An example as a verl-schema record."""
    return {
        "data_source": ex.data_source,
        "prompt": ex.prompt,
        "reward_model": {"ground_truth": ex.ground_truth, "style": "rule"},
        "extra_info": ex.extra_info,
    }


def build(n: int, blanks: int, train_seeds: list[int], task_seed: int, seed: str) -> list[dict]:
    task = SudokuTask(TaskConfig(seed=task_seed, train_path="generated"), blanks=blanks)
    exclude = {str(ex.extra_info["puzzle"]) for ex in task.eval_set()}
    for s in train_seeds:
        exclude.update(str(ex.extra_info["puzzle"]) for ex in task.examples("train", seed=s))
    examples = generate_sudoku(n, seed=f"heldout:{seed}", blanks=blanks, exclude=exclude, split="test")
    return [_row(ex) for ex in examples]


def test_unique() -> list[dict]:
    """The real test puzzles with exactly one solution, in file order."""
    return [
        _row(ex) for ex in SudokuTask(TaskConfig()).eval_set() if count_solutions(str(ex.extra_info["puzzle"])) == 1
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="puzzles to draw")
    ap.add_argument("--blanks", type=int, default=8, help="empty cells per puzzle (the training puzzles': 8)")
    ap.add_argument("--train-seeds", default="0-4", help="run seeds whose training pools are excluded")
    ap.add_argument("--task-seed", type=int, default=0, help="task.seed of those runs")
    ap.add_argument("--seed", default="0", help="seed of the held-out draw")
    ap.add_argument(
        "--test-unique", action="store_true", help="write the real test puzzles with exactly one solution instead"
    )
    ap.add_argument("--out", required=True, help="output .jsonl file")
    args = ap.parse_args(argv)
    if args.n < 1:
        raise DareError(f"--n must be >= 1, got {args.n}")
    if not args.out.endswith(".jsonl"):
        raise DareError(f"--out {args.out!r} must end in .jsonl")
    if args.test_unique:
        rows = test_unique()
    else:
        rows = build(args.n, args.blanks, _seeds(args.train_seeds), args.task_seed, args.seed)
    atomic_write_text(args.out, "".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} puzzles to {args.out}")
    return 0


if __name__ == "__main__":
    run_script(main)
