"""The multiple_choice task: jsonl and parquet read alike (answer as index or text), bad files
refused in one line, generated responses scored against the right choice, and the bundled tiny
Sudoku set answered by likelihood above chance on the tiny LLaDA checkpoint."""

import json
from pathlib import Path

import pytest

from dare_core.api import DareError, TaskConfig, get_dare
from dare_plugin_tasks.multiple_choice import MultipleChoiceTask

DATA = Path(__file__).parent / "data" / "multiple_choice_tiny.jsonl"


def _task(path, **kw):
    return MultipleChoiceTask(TaskConfig(name="multiple_choice", eval_path=str(path), **kw))


def test_registered_lazily():
    spec = get_dare().registries.tasks.get("multiple_choice")
    assert isinstance(spec.build(TaskConfig(name="multiple_choice", eval_path=str(DATA))), MultipleChoiceTask)


def test_jsonl_and_parquet_read_alike(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    # parquet needs one type per column: the answer as the right choice's text throughout
    pq.write_table(
        pa.Table.from_pylist(
            [dict(r, answer=r["choices"][r["answer"]] if isinstance(r["answer"], int) else r["answer"]) for r in rows]
        ),
        tmp_path / "mc.parquet",
    )
    a = _task(DATA).examples("eval")
    b = _task(tmp_path / "mc.parquet").examples("test")
    assert len(a) == len(b) == 10
    for x, y, row in zip(a, b, rows):
        assert x.prompt == y.prompt == [{"role": "user", "content": row["question"]}]
        assert x.extra_info == y.extra_info
        assert x.ground_truth == x.extra_info["choices"][x.extra_info["answer_index"]] == y.ground_truth
    assert [e.extra_info["answer_index"] for e in a][:3] == [0, 0, 2]
    assert len(_task(DATA, num_eval=3).examples("eval")) == 3
    assert len(_task(DATA).examples("eval", limit=4)) == 4


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"choices": ["a"], "answer": 0}, "no context"),
        ({"question": "q", "choices": "ab", "answer": 0}, "choices must be"),
        ({"question": "q", "choices": ["a", "b"], "answer": 2}, "neither an index"),
        ({"question": "q", "choices": ["a", "b"], "answer": "c"}, "neither an index"),
    ],
)
def test_bad_items_refused_in_one_line(tmp_path, row, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DareError, match=problem) as err:
        _task(path).examples("eval")
    assert "\n" not in str(err.value) and "item 0" in str(err.value)


def test_missing_paths_refused():
    with pytest.raises(DareError, match="task.eval_path"):
        MultipleChoiceTask().examples("eval")
    with pytest.raises(DareError, match="task.train_path"):
        _task(DATA).examples("train")
    with pytest.raises(DareError, match="not found"):
        _task("/nonexistent.jsonl").examples("eval")


def test_score_of_a_generated_response(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"context": "2 + 2 =", "choices": ["3", "Four", "5"], "answer": "Four"}) + "\n")
    ex = _task(path).examples("eval")[0]
    assert ex.ground_truth == "Four" and ex.extra_info["answer_index"] == 1
    assert _task(path).score(ex, "  four.\n").acc == 1.0
    assert _task(path).score(ex, "5").acc == 0.0


def test_likelihood_choice_on_the_tiny_checkpoint():
    from dare_objectives.likelihood import choose

    dare = get_dare()
    if "llada" not in dare.registries.models:
        pytest.skip("llada not installed")
    fam = dare.registries.models.get("llada")
    wrapper = fam.load(fam.default_checkpoint)
    examples = _task(DATA).examples("eval")
    picks = choose(wrapper, examples, samples=8, seed=0)
    right = sum(p == e.extra_info["answer_index"] for p, e in zip(picks, examples))
    assert right >= 7  # four choices each: chance is 2.5 of 10
