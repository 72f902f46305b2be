"""``dare compare`` (from dare-plugin-report) on the bundled checkpoint, whose common random
numbers make a checkpoint's sampled answers identical to its own (A vs A: no discordant sample,
no clustered change). ``dare eval`` on it: dare-plugin-eval's tests."""

import json
import os

import pytest

import dare_plugin_llada
import dare_plugin_report
from dare_core.testing.registries import build_for
from dare_plugin_llada.wrapper import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="needs the bundled checkpoint")


@pytest.fixture(scope="module")
def dare_with_report():
    return build_for(dare_plugin_llada, dare_plugin_report)


@pytest.fixture
def compare(dare_with_report, dare_cli):
    """``compare(*args)``: the result of ``dare compare ARGS`` with the llada registry."""
    dare = dare_cli(dare_with_report)
    return lambda *args: dare("compare", *args)


def _stdout(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def _records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_against_itself_under_sampling(compare, tmp_path):
    out = _stdout(
        compare(
            "--model",
            "llada",
            "--a",
            "bundled",
            "--b",
            "bundled",
            "--b",
            BUNDLED,
            "--samples",
            "3",
            "--pool",
            "task.num_eval=4",
            "eval.temperature=1.0",
            "eval.batch_size=12",
            f"output_dir={tmp_path}",
        )
    )
    records = _records(out)
    assert len(records) == 3 and records[1]["b_path"] == BUNDLED
    pooled = records.pop()
    assert pooled["pooled"] == ["bundled", BUNDLED] and pooled["accuracy"] == records[0]["a"]["accuracy"]
    assert pooled["clustered"]["delta"] == 0.0
    for rec in records:
        assert rec["a"]["n"] == rec["b"]["n"] == 12
        assert rec["a"]["accuracy"] == rec["b"]["accuracy"]
        assert (rec["samples"]["gained"], rec["samples"]["lost"]) == (0, 0)
        assert rec["clustered"]["prompts"] == 4 and rec["clustered"]["delta"] == 0.0
        assert rec["clustered"]["p_value"] == 1.0


def test_missing_checkpoint_fails_before_any_evaluation(compare, tmp_path, monkeypatch):
    def evaluated(*args, **kwargs):
        raise AssertionError("A was evaluated before B's config was checked")

    monkeypatch.setattr("dare_plugin_report.compare.sampled_items", evaluated)
    result = compare("--model", "llada", "--a", "bundled", "--b", str(tmp_path / "nope"))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "does not exist" in lines[0]


def test_cache_reads_back_repeated_evaluations(compare, tmp_path):
    cache = tmp_path / "cache"
    args = [
        "--model",
        "llada",
        "--a",
        "bundled",
        "--b",
        BUNDLED,
        "--samples",
        "2",
        "--cache",
        str(cache),
        "task.num_eval=3",
        "eval.temperature=1.0",
        f"output_dir={tmp_path}",
    ]
    first = _stdout(compare(*args))
    assert first.count("(cached:") == 1  # B is the same checkpoint and sampler as A: read back
    assert len(list(cache.glob("*.json"))) == 1
    second = _stdout(compare(*args))
    assert second.count("(cached:") == 2
    records = _records(first + second)
    assert records[0] == records[1]
    out = _stdout(compare(*args, "eval.temperature=0.5"))  # another sampler: A evaluated anew
    assert out.count("(cached:") == 1  # and B read back from A's new entry
    assert len(list(cache.glob("*.json"))) == 2
    # the run's eval schedule and sample dumps decide no answer: read back, no new entry
    out = _stdout(compare(*args, "eval.before=false", "eval.every=5", "eval.save_samples=1"))
    assert out.count("(cached:") == 2
    assert len(list(cache.glob("*.json"))) == 2
    assert not list(cache.glob("*.tmp*"))
