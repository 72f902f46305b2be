"""``research/heldout_sudoku.py``: a fresh held-out set, disjoint from the test set and from the
training pools of the given run seeds."""

import importlib.util
import pathlib

import pytest

from dare_core.config import TaskConfig
from dare_core.errors import DareError
from dare_plugin_tasks.parquet import load_examples
from dare_plugin_tasks.sudoku import SudokuTask, count_solutions, sudoku_reference_response

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "heldout_sudoku.py"
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="needs the repository's research/")


def _script():
    spec = importlib.util.spec_from_file_location("heldout_sudoku", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_disjoint_from_test_set_and_training_pools(tmp_path, capsys):
    out = tmp_path / "h.jsonl"
    assert _script().main(["--n", "300", "--train-seeds", "0,2", "--out", str(out)]) == 0
    examples = load_examples(str(out))
    puzzles = [str(ex.extra_info["puzzle"]) for ex in examples]
    assert len(set(puzzles)) == 300
    task = SudokuTask(TaskConfig(train_path="generated"))
    forbidden = {str(ex.extra_info["puzzle"]) for ex in task.eval_set()}
    for seed in (0, 2):
        forbidden |= {str(ex.extra_info["puzzle"]) for ex in task.examples("train", seed=seed)}
    assert not forbidden & set(puzzles)
    for ex, puzzle in zip(examples, puzzles):
        assert puzzle.count("0") == 8 and count_solutions(puzzle) == 1
        assert all(p in ("0", g) for p, g in zip(puzzle, ex.ground_truth))
        assert task.score(ex, sudoku_reference_response(ex.ground_truth)).acc == 1.0
    # deterministic for its seed, another seed draws other puzzles
    again = tmp_path / "again.jsonl"
    _script().main(["--n", "300", "--train-seeds", "0,2", "--out", str(again)])
    assert again.read_text() == out.read_text()
    other = tmp_path / "other.jsonl"
    _script().main(["--n", "300", "--train-seeds", "0,2", "--seed", "1", "--out", str(other)])
    assert other.read_text() != out.read_text()


def test_unique_solution_subset_of_the_test_set(tmp_path):
    out = tmp_path / "u.jsonl"
    _script().main(["--test-unique", "--out", str(out)])
    kept = [str(ex.extra_info["puzzle"]) for ex in load_examples(str(out))]
    every = [str(ex.extra_info["puzzle"]) for ex in SudokuTask(TaskConfig()).eval_set()]
    assert kept == [p for p in every if count_solutions(p) == 1]
    assert 0 < len(kept) < len(every)  # the real test set has puzzles with several solutions


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-seeds", "zero"], "--train-seeds takes seeds"),
        (["--n", "0"], "--n must be"),
        (["--out", "x.parquet"], "must end in .jsonl"),
    ],
)
def test_bad_input_is_one_error(args, message, tmp_path):
    argv = ["--out", str(tmp_path / "h.jsonl"), *args]
    with pytest.raises(DareError, match=message):
        _script().main(argv)
