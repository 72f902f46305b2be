"""Evaluation commands on the bundled checkpoint: ``dare eval``, and ``scripts/paired_eval.py``,
whose common random numbers make a checkpoint's sampled answers identical to its own (A vs A: no
discordant sample, no clustered change)."""

import importlib.util
import json
import os
import pathlib

import pytest
from click.testing import CliRunner

import dare_plugin_llada
import dare_core.plugins
from dare_core.cli import cli
from dare_core.plugins import build
from dare_plugin_llada.wrapper import BUNDLED

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "paired_eval.py"
pytestmark = pytest.mark.skipif(not (os.path.isdir(BUNDLED) and SCRIPT.is_file()),
                                reason="needs the bundled checkpoint and the repository's scripts/")


def _script():
    spec = importlib.util.spec_from_file_location("paired_eval", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dare():
    return build(load_entrypoints=False, extra_plugins=[dare_plugin_llada])


def test_dare_eval_json(dare, monkeypatch):
    monkeypatch.setattr(dare_core.plugins, "_DARE", dare)
    result = CliRunner().invoke(cli, ["eval", "--model", "llada", "--json", "task.num_eval=6",
                                      "eval.batch_size=4"], prog_name="dare")
    assert result.exit_code == 0, result.output
    rec = json.loads(result.stdout.strip().splitlines()[-1])
    assert rec["n"] == 6 and 0.0 <= rec["accuracy"] <= 1.0 and rec["nfe"] == 2 * 20  # two batches x 20 steps


def test_a_against_itself_under_sampling(dare, capsys, tmp_path):
    _script().main(["--model", "llada", "--a", "bundled", "--b", "bundled", "--b", BUNDLED, "--samples", "3", "--pool",
                    "task.num_eval=4", "eval.temperature=1.0", "eval.batch_size=12", f"output_dir={tmp_path}"],
                   dare=dare)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
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


def test_missing_checkpoint_fails_before_any_evaluation(dare, tmp_path):
    from dare_core.errors import DareError

    with pytest.raises(DareError, match="does not exist"):
        _script().main(["--model", "llada", "--a", "bundled", "--b", str(tmp_path / "nope")], dare=dare)


def test_cache_reads_back_repeated_evaluations(dare, capsys, tmp_path):
    cache = tmp_path / "cache"
    args = ["--model", "llada", "--a", "bundled", "--b", BUNDLED, "--samples", "2", "--cache", str(cache),
            "task.num_eval=3", "eval.temperature=1.0", f"output_dir={tmp_path}"]
    _script().main(args, dare=dare)
    first = capsys.readouterr().out
    assert first.count("(cached:") == 1  # B is the same checkpoint and sampler as A: read back
    assert len(list(cache.glob("*.json"))) == 1
    _script().main(args, dare=dare)
    second = capsys.readouterr().out
    assert second.count("(cached:") == 2
    records = [json.loads(line) for line in (first + second).splitlines() if line.startswith("{")]
    assert records[0] == records[1]
    _script().main([*args, "eval.temperature=0.5"], dare=dare)  # another sampler: A evaluated anew
    assert capsys.readouterr().out.count("(cached:") == 1  # and B read back from A's new entry
    assert len(list(cache.glob("*.json"))) == 2
    # the run's eval schedule and sample dumps decide no answer: read back, no new entry
    _script().main([*args, "eval.before=false", "eval.every=5", "eval.save_samples=1"], dare=dare)
    assert capsys.readouterr().out.count("(cached:") == 2
    assert len(list(cache.glob("*.json"))) == 2
    assert not list(cache.glob("*.tmp*"))
