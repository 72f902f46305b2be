"""The verl-schema loader, the bundled data files and the file-backed tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dare_core.config import TaskConfig
from dare_core.errors import DareError
from dare_plugin_tasks._base import DATA_DIR
from dare_plugin_tasks.parquet import AIME2024Task, AIME2025Task, GSM8KTask, Math500Task, ParquetTask, load_examples

SHARED = Path(__file__).resolve().parents[4].parent / "shared" / "data"  # ../shared beside the clone
# bundled file -> (rows, data_source, the file in the shared data it copies)
TEST_SETS = {
    "sudoku_test.parquet": (500, "sudoku", "rl/test/sudoku.parquet"),
    "countdown_test.parquet": (256, "countdown", "rl/test/countdown.parquet"),
    "gsm8k_test.parquet": (1319, "gsm8k", "rl/test/gsm8k.parquet"),
    "math500_test.parquet": (500, "math500", "rl/test/math500.parquet"),
    "aime2024_test.parquet": (30, "aime2024", "rl/test/aime2024.parquet"),
    "aime2025_test.parquet": (30, "aime2025", "rl/test/aime2025.parquet"),
    "humaneval_test.parquet": (164, "humaneval", "rl/test/humaneval.parquet"),
    "humanevalplus_test.parquet": (163, "humanevalplus", "rl/test/humanevalplus.parquet"),
    "mbpp_test.parquet": (500, "mbpp", "rl/test/mbpp.parquet"),
}
TRAIN_SETS = {
    "gsm8k_train.parquet": (7473, "gsm8k", "rl/train/gsm8k.parquet"),
    "math_train.parquet": (7474, "math", "rl/train/math.parquet"),
    "countdown_train.parquet": (20000, "countdown", "rl/train/countdown-n20000.parquet"),
    "sudoku_train.parquet": (20000, "sudoku", "rl/train/sudoku-n20000.parquet"),
}
BUNDLED = {**TEST_SETS, **TRAIN_SETS}


def _one_line_error(fn, *args, match=None):
    with pytest.raises(DareError, match=match) as info:
        fn(*args)
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("filename", sorted(BUNDLED))
def test_bundled_files_are_complete(filename):
    rows, source, _ = BUNDLED[filename]
    split = "test" if filename in TEST_SETS else "train"
    table = pq.read_table(DATA_DIR / filename)
    assert table.num_rows == rows
    assert set(table.column("data_source").to_pylist()) == {source}
    infos = table.column("extra_info").to_pylist()
    assert [info["index"] for info in infos] == list(range(rows))
    assert {info["split"] for info in infos} == {split}
    assert {info["task"] for info in infos} == {"code" if source in ("humaneval", "humanevalplus", "mbpp") else "math"}


def test_bundled_data_is_small_and_in_the_wheel():
    assert sum(p.stat().st_size for p in DATA_DIR.glob("*.parquet")) < 10_000_000
    assert sorted(p.name for p in DATA_DIR.glob("*.parquet")) == sorted(BUNDLED)
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'dare_plugin_tasks = ["data/*.parquet"]' in pyproject


@pytest.mark.skipif(not SHARED.exists(), reason="shared data (../shared beside the clone) not present")
@pytest.mark.parametrize("filename", sorted(BUNDLED))
def test_bundled_files_are_the_shared_sets(filename):
    real = pq.read_table(SHARED / BUNDLED[filename][2])
    ours = pq.read_table(DATA_DIR / filename)
    assert ours.to_pylist() == real.to_pylist()


def test_bundled_math_train_skips_rows_without_an_answer():
    raw = load_examples(str(DATA_DIR / "gsm8k_train.parquet"), limit=3)
    assert [ex.ground_truth for ex in raw] == ["72", "10", "5"]
    with pytest.raises(DareError, match="row 886: reward_model.ground_truth is missing"):
        load_examples(str(DATA_DIR / "math_train.parquet"))
    items = Math500Task().examples("train")
    assert len(items) == 7470 and all(ex.ground_truth for ex in items)
    assert {ex.data_source for ex in items} == {"math"}


def test_limit():
    assert len(load_examples(str(DATA_DIR / "gsm8k_test.parquet"), limit=5)) == 5
    assert load_examples(str(DATA_DIR / "gsm8k_test.parquet"), limit=0) == []


def test_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [
        {"data_source": "gsm8k", "prompt": "What is 2+2?", "reward_model": {"ground_truth": 4}},
        {
            "data_source": "countdown",
            "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"}],
            "reward_model": {"ground_truth": "5", "style": "rule"},
            "extra_info": {"numbers": "[2, 3, 4]", "index": 7},
        },
        {
            "data_source": "gsm8k",
            "prompt": "q",
            "reward_model": {"ground_truth": "1"},
            "response": "The answer is \\boxed{1}.",
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = load_examples(str(path))
    assert len(items) == 3
    assert items[0].prompt == [{"role": "user", "content": "What is 2+2?"}]
    assert items[0].ground_truth == "4" and items[0].extra_info == {} and items[0].response is None
    assert items[1].prompt[0] == {"role": "system", "content": "sys"}
    assert items[1].extra_info == {"numbers": "[2, 3, 4]", "index": 7}
    assert items[2].response == "The answer is \\boxed{1}."
    assert len(load_examples(str(path), limit=2)) == 2
    task = ParquetTask(TaskConfig(name="parquet", train_path=str(path), eval_path=str(path)))
    ev = task.examples("eval")
    assert task.score(ev[0], "\\boxed{4}").score == 1.0
    assert task.score(ev[1], "<answer>2*4-3</answer>").score == 1.0
    assert [e.ground_truth for e in task.examples("train", limit=2)] == ["4", "5"]


def _write_sft_parquet(path: Path) -> None:
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"content": "Natalia sold clips...", "role": "user"}],
                "ability": "math",
                "reward_model": {"ground_truth": "72", "style": "rule"},
                "extra_info": {
                    "answer": "48/2 = 24\n48+24 = 72\n#### 72",
                    "index": 0,
                    "question": "Natalia sold clips...",
                    "split": "train",
                },
            },
        ]
    )
    pq.write_table(table, path)


def test_sft_file_sets_response(tmp_path):
    path = tmp_path / "sft.parquet"
    _write_sft_parquet(path)
    (ex,) = load_examples(str(path))
    assert ex.response == "48/2 = 24\n48+24 = 72\n#### 72"
    assert ex.data_source == "openai/gsm8k" and ex.ground_truth == "72"
    task = GSM8KTask(TaskConfig(name="gsm8k", train_path=str(path)))
    assert task.examples("train")[0].response == ex.response
    assert len(task.examples("eval")) == 200


@pytest.mark.skipif(not (SHARED / "sft" / "gsm8k_train.parquet").exists(), reason="shared data not mounted")
def test_real_sft_file():
    items = load_examples(str(SHARED / "sft" / "gsm8k_train.parquet"), limit=3)
    assert all(ex.response and "####" in ex.response for ex in items)


# --------------------------------------------------------------------------- errors


def test_missing_file():
    msg = _one_line_error(load_examples, "/nonexistent/train.parquet", match="not found")
    assert "/nonexistent/train.parquet" in msg


def test_missing_columns_parquet(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "a"}]), path)
    msg = _one_line_error(load_examples, str(path), match="missing column")
    assert str(path) in msg
    assert "data_source, prompt, reward_model" in msg


def test_missing_keys_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "q"}) + "\n")
    msg = _one_line_error(load_examples, str(path), match="line 1 is missing key")
    assert str(path) in msg and "data_source" in msg and "reward_model" in msg


def test_malformed_rows(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"data_source": "gsm8k", "prompt": "q", "reward_model": {"ground_truth": 1}}\n{not json\n')
    _one_line_error(load_examples, str(path), match="line 2 is not valid JSON")
    path.write_text(json.dumps({"data_source": "x", "prompt": 3, "reward_model": {"ground_truth": "1"}}) + "\n")
    _one_line_error(load_examples, str(path), match="prompt must be")
    path.write_text(json.dumps({"data_source": "x", "prompt": "q", "reward_model": {}}) + "\n")
    _one_line_error(load_examples, str(path), match="ground_truth")


def test_unreadable_and_unsupported_files(tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"data_source": "x"}\n\xff\xfe\x00garbage\n')
    msg = _one_line_error(load_examples, str(binary), match="not a readable UTF-8 .jsonl file")
    assert str(binary) in msg
    path = tmp_path / "garbage.parquet"
    path.write_bytes(b"this is not parquet\nat all\n")
    msg = _one_line_error(load_examples, str(path), match="not a readable parquet")
    assert str(path) in msg
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    _one_line_error(load_examples, str(csv), match="unsupported file type '.csv'")


def test_file_tasks_require_paths():
    task = ParquetTask(TaskConfig(name="parquet"))
    _one_line_error(task.examples, "train", match="task.train_path")
    _one_line_error(task.examples, "eval", match="task.eval_path")
    for cls in (AIME2024Task, AIME2025Task):
        task = cls(TaskConfig(name=cls.name))
        assert len(task.examples("eval")) == 30
        _one_line_error(task.examples, "train", match="no built-in training data.*train_path")
        gen = cls(TaskConfig(name=cls.name, train_path="generated"))  # no generator: as null
        _one_line_error(gen.examples, "train", match="no built-in training data.*train_path")


def test_math_tasks_train_on_the_bundled_splits_by_default(tmp_path):
    gsm8k, math500 = GSM8KTask(TaskConfig(name="gsm8k")), Math500Task(TaskConfig(name="math500"))
    assert len(gsm8k.examples("eval")) == 200 and len(gsm8k.examples("eval", limit=5000)) == 1319
    assert len(math500.examples("eval", limit=5000)) == 500
    assert len(gsm8k.examples("train")) == 7473
    first = gsm8k.examples("train", limit=2)
    assert first[0].prompt[0]["content"].startswith("Natalia sold clips") and first[0].response is None
    assert gsm8k.score(first[0], "\\boxed{72}").acc == 1.0
    assert len(GSM8KTask(TaskConfig(name="gsm8k", train_path="generated")).examples("train")) == 7473
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"data_source": "gsm8k", "prompt": "q", "reward_model": {"ground_truth": "3"}}) + "\n")
    assert [ex.prompt for ex in GSM8KTask(TaskConfig(name="gsm8k", train_path=str(own))).examples("train")] == [
        [{"role": "user", "content": "q"}]
    ]


def test_missing_configured_path_names_it(tmp_path):
    task = ParquetTask(TaskConfig(name="parquet", eval_path=str(tmp_path / "nope.jsonl")))
    msg = _one_line_error(task.examples, "eval", match="not found")
    assert "nope.jsonl" in msg


@pytest.mark.parametrize("task_cls, source", [(AIME2024Task, "aime2024"), (AIME2025Task, "aime2025")])
def test_aime_eval_is_every_problem_scored_by_its_answer(task_cls, source):
    task = task_cls()
    items = task.examples("eval")
    assert len(items) == 30 and {ex.data_source for ex in items} == {source}
    for ex in items:
        assert task.score(ex, f"so the answer is \\boxed{{{ex.ground_truth}}}.").acc == 1.0
        assert task.score(ex, "\\boxed{1000}").acc == 0.0  # AIME answers are below 1000


def test_math500_eval_scores_its_own_answers():
    task = Math500Task()
    for ex in task.examples("eval"):
        assert task.score(ex, f"Thus \\boxed{{{ex.ground_truth}}}.").score == 1.0, ex.ground_truth
