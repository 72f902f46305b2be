"""Sudoku and countdown generators and tasks: validity, prompts, determinism, disjointness."""

from __future__ import annotations

import json
import re

import pluggy
import pytest

from dare_core import hookspecs
from dare_core.config import TaskConfig
from dare_core.errors import DareError
from dare_core.interfaces.seams import Example, TaskSpec
from dare_plugin_tasks.countdown import (
    COUNTDOWN_REASONING,
    CountdownTask,
    countdown_prompt,
    generate_countdown,
    solve_countdown,
)
from dare_plugin_tasks.multiple_choice import MultipleChoiceTask
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
from dare_plugin_tasks.rewards import countdown_reward, score_example, sudoku_reward
from dare_plugin_tasks.sudoku import (
    SUDOKU_REASONING,
    SudokuTask,
    count_solutions,
    generate_sudoku,
    solution_grids,
    sudoku_prompt,
)

GEN = TaskConfig(train_path="generated")  # the generators instead of the bundled train splits


@pytest.fixture(scope="module")
def sudoku_eval():
    return SudokuTask().examples("eval", limit=10_000)


@pytest.fixture(scope="module")
def countdown_eval():
    return CountdownTask().examples("eval", limit=10_000)


@pytest.fixture(scope="module")
def sudoku_train():
    return SudokuTask(GEN).examples("train", limit=3000)


@pytest.fixture(scope="module")
def countdown_train():
    return CountdownTask(GEN).examples("train", limit=1000)


# --------------------------------------------------------------------------- sudoku


def _valid_grid(g: str) -> bool:
    rows = [g[r * 4 : r * 4 + 4] for r in range(4)]
    cols = ["".join(g[r * 4 + c] for r in range(4)) for c in range(4)]
    boxes = ["".join(g[(br + a) * 4 + bc + b] for a in range(2) for b in range(2)) for br in (0, 2) for bc in (0, 2)]
    return all(sorted(u) == list("1234") for u in rows + cols + boxes)


def test_solution_grids():
    grids = solution_grids()
    assert len(grids) == 288 and len(set(grids)) == 288
    assert all(_valid_grid(g) for g in grids)


def test_count_solutions_brute_force():
    assert count_solutions("3142243142131324") == 1
    assert count_solutions("0" * 16) == 288
    with pytest.raises(ValueError):
        count_solutions("123")


def test_sudoku_train_items_are_valid_and_unique(sudoku_train):
    assert len(sudoku_train) == 3000
    puzzles = [ex.extra_info["puzzle"] for ex in sudoku_train]
    assert len(set(puzzles)) == len(puzzles)
    for i, ex in enumerate(sudoku_train[:500]):
        puzzle, solution = ex.extra_info["puzzle"], ex.ground_truth
        assert puzzle.count("0") == 8
        assert _valid_grid(solution)
        assert all(p in ("0", s) for p, s in zip(puzzle, solution))
        assert count_solutions(puzzle) == 1
        assert ex.data_source == "sudoku"
        assert ex.extra_info == {"index": i, "puzzle": puzzle, "split": "train", "task": "math"}


def test_sudoku_blanks_configurable():
    items = generate_sudoku(50, seed=3, blanks=10)
    assert all(ex.extra_info["puzzle"].count("0") == 10 for ex in items)
    assert all(count_solutions(ex.extra_info["puzzle"]) == 1 for ex in items)
    assert SudokuTask(GEN, blanks=6).examples("train", limit=5)[0].extra_info["puzzle"].count("0") == 6
    with pytest.raises(DareError):
        SudokuTask(blanks=13)


def test_sudoku_reference_responses_score_one(sudoku_train):
    for ex in sudoku_train[:1000]:
        assert ex.response == (f"<reasoning>\n{SUDOKU_REASONING}\n</reasoning>\n<answer>\n{ex.ground_truth}\n</answer>")
        assert sudoku_reward(ex.response, ex.extra_info["puzzle"], ex.ground_truth).score == 1.0
        assert score_example(ex, ex.response).acc == 1.0


def test_sudoku_prompt_matches_real_data(sudoku_eval, sudoku_train):
    assert len(sudoku_eval) == 500
    for real in sudoku_eval:
        assert sudoku_prompt(real.extra_info["puzzle"]) == real.prompt
    real = sudoku_eval[0]
    for ex in sudoku_train[:50]:
        puzzle = ex.extra_info["puzzle"]
        expected = real.prompt[0]["content"].replace(real.extra_info["puzzle"], puzzle)
        assert ex.prompt == [{"role": "user", "content": expected}]


def test_sudoku_deterministic_by_seed():
    a = SudokuTask(GEN).examples("train", limit=40, seed=1)
    b = SudokuTask(GEN).examples("train", limit=40, seed=1)
    c = SudokuTask(GEN).examples("train", limit=40, seed=2)
    d = SudokuTask(TaskConfig(seed=5, train_path="generated")).examples("train", limit=40, seed=1)
    key = lambda items: [ex.extra_info["puzzle"] for ex in items]  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(c) and key(a) != key(d)
    assert key(SudokuTask(GEN).examples("train", limit=10, seed=1)) == key(a)[:10]


def test_sudoku_train_eval_disjoint(sudoku_eval, sudoku_train):
    eval_puzzles = {ex.extra_info["puzzle"] for ex in sudoku_eval}
    assert not eval_puzzles & {ex.extra_info["puzzle"] for ex in sudoku_train}


def test_sudoku_exclusion_with_custom_eval_set(tmp_path):
    # the puzzles the task would generate become its eval set: it must generate others
    would_be = SudokuTask(GEN).examples("train", limit=30)
    path = tmp_path / "eval.jsonl"
    with open(path, "w") as fh:
        for ex in would_be:
            fh.write(
                json.dumps(
                    {
                        "data_source": ex.data_source,
                        "prompt": ex.prompt,
                        "reward_model": {"ground_truth": ex.ground_truth},
                        "extra_info": ex.extra_info,
                    }
                )
                + "\n"
            )
    task = SudokuTask(TaskConfig(eval_path=str(path), train_path="generated"))
    assert [e.extra_info["puzzle"] for e in task.examples("eval")] == [e.extra_info["puzzle"] for e in would_be]
    fresh = task.examples("train", limit=30)
    assert not {e.extra_info["puzzle"] for e in fresh} & {e.extra_info["puzzle"] for e in would_be}


# --------------------------------------------------------------------------- countdown


def test_solve_countdown():
    sols = solve_countdown([2, 3, 4])
    assert 5 in sols and countdown_reward(f"<answer>{sols[5]}</answer>", [2, 3, 4], 5).score == 1.0
    assert sols[24] in ("2*3*4", "2*4*3", "3*2*4", "3*4*2", "4*2*3", "4*3*2")
    assert all(v >= 0 for v in sols)


def test_countdown_train_items_are_valid(countdown_train):
    assert len(countdown_train) == 1000
    keys = set()
    for i, ex in enumerate(countdown_train):
        numbers = json.loads(ex.extra_info["numbers"])
        target = int(ex.ground_truth)
        assert len(numbers) == 3 and all(1 <= n <= 100 for n in numbers)
        assert 1 <= target <= 100
        assert ex.extra_info == {"index": i, "numbers": json.dumps(numbers), "split": "train", "task": "math"}
        keys.add((tuple(sorted(numbers)), target))
        assert ex.data_source == "countdown"
        head = f"<reasoning>\n{COUNTDOWN_REASONING}\n</reasoning>\n<answer>\n"
        m = re.fullmatch(re.escape(head) + r"(.+)\n</answer>", ex.response)
        assert m, ex.response
        expr = m.group(1)
        assert sorted(int(n) for n in re.findall(r"\d+", expr)) == sorted(numbers)
        s = countdown_reward(ex.response, numbers, target)
        assert s.score == 1.0 and s.pred == expr
        assert score_example(ex, ex.response).acc == 1.0
    assert len(keys) == len(countdown_train)


def test_countdown_prompt_matches_real_data(countdown_eval, countdown_train):
    assert len(countdown_eval) == 256
    for real in countdown_eval:
        numbers = json.loads(real.extra_info["numbers"])
        assert countdown_prompt(numbers, int(real.ground_truth)) == real.prompt
    real = countdown_eval[0]
    real_text = real.prompt[0]["content"]
    real_numbers = f"numbers {real.extra_info['numbers']},"
    real_target = f"exactly {real.ground_truth}."
    assert real_text.count(real_numbers) == 1 and real_text.count(real_target) == 1
    for ex in countdown_train[:50]:
        expected = real_text.replace(real_numbers, f"numbers {ex.extra_info['numbers']},")
        expected = expected.replace(real_target, f"exactly {ex.ground_truth}.")
        assert ex.prompt == [{"role": "user", "content": expected}]


def test_countdown_deterministic_by_seed():
    def key(items):
        return [(ex.extra_info["numbers"], ex.ground_truth, ex.response) for ex in items]

    a = CountdownTask(GEN).examples("train", limit=30, seed=4)
    assert key(a) == key(CountdownTask(GEN).examples("train", limit=30, seed=4))
    assert key(a) != key(CountdownTask(GEN).examples("train", limit=30, seed=5))
    assert key(a) != key(CountdownTask(TaskConfig(seed=1, train_path="generated")).examples("train", limit=30, seed=4))


def test_countdown_train_eval_disjoint(countdown_eval, countdown_train):
    def key(ex):
        return tuple(sorted(json.loads(ex.extra_info["numbers"]))), int(ex.ground_truth)

    assert not {key(e) for e in countdown_eval} & {key(e) for e in countdown_train}


def test_countdown_exclusion_is_applied():
    first = generate_countdown(40, seed=9)
    keys = {(tuple(sorted(json.loads(e.extra_info["numbers"]))), int(e.ground_truth)) for e in first}
    again = generate_countdown(40, seed=9, exclude=keys)
    assert not keys & {(tuple(sorted(json.loads(e.extra_info["numbers"]))), int(e.ground_truth)) for e in again}


# --------------------------------------------------------------------------- task protocol


def test_eval_split_uses_num_eval():
    assert len(SudokuTask().examples("eval")) == 200
    assert len(CountdownTask(TaskConfig(name="countdown", num_eval=7)).examples("eval")) == 7
    assert len(CountdownTask().examples("test", limit=3)) == 3
    assert SudokuTask().examples("eval")[0].extra_info["puzzle"] == "3102200002100320"


def test_bundled_train_splits_are_the_default(sudoku_eval, countdown_eval):
    sudoku = SudokuTask().examples("train")
    assert len(sudoku) == 20000 and sudoku[0].extra_info["puzzle"] == "0321003004002100"
    assert {ex.extra_info["puzzle"].count("0") for ex in sudoku} == {9}
    assert not {ex.extra_info["puzzle"] for ex in sudoku} & {ex.extra_info["puzzle"] for ex in sudoku_eval}
    for ex in sudoku[:200]:  # the reference response is derived from the solution: SFT works on it
        assert sudoku_prompt(ex.extra_info["puzzle"]) == ex.prompt
        assert score_example(ex, ex.response).acc == 1.0
    countdown = CountdownTask().examples("train", limit=100)
    assert countdown[0].extra_info["numbers"] == "[44, 19, 35]" and countdown[0].ground_truth == "98"
    assert all(ex.response is None for ex in countdown)
    assert {len(json.loads(ex.extra_info["numbers"])) for ex in countdown} == {3, 4}
    for ex in countdown[:20]:
        best = solve_countdown(json.loads(ex.extra_info["numbers"]))[int(ex.ground_truth)]
        assert countdown_reward(f"<answer>{best}</answer>", ex.extra_info["numbers"], ex.ground_truth).acc == 1.0
    # the same seed gives the same bundled items: the trainer shuffles, not the task
    assert SudokuTask().examples("train", limit=5, seed=3)[0].extra_info["puzzle"] == "0321003004002100"


def test_examples_are_copies():
    task = SudokuTask()
    first = task.examples("eval", limit=1)
    first[0].extra_info["puzzle"] = "changed"
    first[0].prompt[0]["content"] = "changed"
    again = task.examples("eval", limit=1)[0]
    assert again.extra_info["puzzle"] == "3102200002100320"
    assert again.prompt[0]["content"] != "changed"


def test_bad_split_and_limit():
    with pytest.raises(DareError, match="unknown split"):
        SudokuTask().examples("validation-ish")
    with pytest.raises(DareError, match="limit"):
        SudokuTask(GEN).examples("train", limit=-1)


def test_task_config():
    import attrs

    cfg = TaskConfig()
    assert (cfg.name, cfg.train_path, cfg.eval_path, cfg.num_eval, cfg.seed) == ("sudoku", None, None, 200, 0)
    for field in attrs.fields(TaskConfig):
        assert field.metadata.get("help"), field.name
    with pytest.raises(ValueError, match="> 0"):
        TaskConfig(num_eval=0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.seed = 3


def test_plugin_registers_tasks():
    import dare_plugin_tasks as plugin

    pm = pluggy.PluginManager("dare")
    pm.add_hookspecs(hookspecs)
    pm.register(plugin, name="dare_plugin_tasks")
    specs: list[TaskSpec] = []
    pm.hook.dare_register_tasks(register=specs.append)
    by_name = {s.name: s for s in specs}
    classes = {
        "sudoku": SudokuTask,
        "countdown": CountdownTask,
        "gsm8k": GSM8KTask,
        "math500": Math500Task,
        "aime2024": AIME2024Task,
        "aime2025": AIME2025Task,
        "parquet": ParquetTask,
        "humaneval": HumanEvalTask,
        "humaneval_plus": HumanEvalPlusTask,
        "mbpp": MBPPTask,
        "multiple_choice": MultipleChoiceTask,
    }
    assert set(by_name) == set(classes)
    for name, spec in by_name.items():
        assert spec.description and "\n" not in spec.description
        task = spec.build(TaskConfig(name=name))
        assert isinstance(task, classes[name]) and task.name == name
        assert callable(task.examples) and callable(task.score)


def test_score_method_matches_reward():
    ex = CountdownTask().examples("eval", limit=1)[0]
    assert isinstance(ex, Example)
    assert CountdownTask().score(ex, "no answer").score == 0.0
