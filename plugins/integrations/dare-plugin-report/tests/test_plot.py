"""``dare plot``: learning curves from run directories."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from dare_core.cli import cli
from dare_core.errors import DareError
from dare_plugin_report.plot import load_curves, moving_average, plot_runs


def _run(tmp_path, name, rewards, evals=(), torn=False):
    d = tmp_path / name
    d.mkdir()
    lines = []
    for step, acc in evals[:1]:
        lines.append(json.dumps({"step": step, "eval": {"accuracy": acc, "n": 10}}))
    for i, r in enumerate(rewards, 1):
        lines.append(json.dumps({"step": i, "reward": r, "loss": -r, "flag": True}))
    for step, acc in evals[1:]:
        lines.append(json.dumps({"step": step, "eval": {"accuracy": acc, "n": 10}}))
    text = "\n".join(lines) + "\n"
    if torn:
        text += '{"step": 9, "rew'
    (d / "metrics.jsonl").write_text(text)
    (d / "summary.json").write_text(json.dumps({"algo": "x_algo", "model": "y_model"}))
    return str(d)


def test_load_curves_splits_training_and_eval_rows(tmp_path):
    run = _run(tmp_path, "a", [0.1, 0.2, 0.4], evals=[(0, 0.3), (3, 0.5)], torn=True)
    c = load_curves(run, ["reward", "eval.accuracy"])
    assert c["reward"].steps == [1, 2, 3] and c["reward"].values == [0.1, 0.2, 0.4]
    assert not c["reward"].is_eval
    assert c["eval.accuracy"].steps == [0, 3] and c["eval.accuracy"].values == [0.3, 0.5]
    assert c["eval.accuracy"].is_eval


def test_missing_metric_lists_what_the_run_has(tmp_path):
    run = _run(tmp_path, "a", [0.1], evals=[(0, 0.3)])
    with pytest.raises(DareError) as err:
        load_curves(run, ["rewrd"])
    msg = str(err.value)
    assert "'rewrd'" in msg and "reward" in msg and "eval.accuracy" in msg
    assert "flag" not in msg  # booleans are not curves
    with pytest.raises(DareError, match="no metrics.jsonl"):
        load_curves(str(tmp_path), ["reward"])


def test_damaged_middle_line_is_an_error(tmp_path):
    run = _run(tmp_path, "a", [0.1, 0.2])
    path = os.path.join(run, "metrics.jsonl")
    lines = open(path).read().splitlines()
    lines.insert(1, "{oops")
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(DareError, match=r"metrics.jsonl:2 is not valid JSON"):
        load_curves(run, ["reward"])


def test_moving_average_is_trailing():
    assert moving_average([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([1, 2], 1) == [1, 2]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    a = _run(tmp_path, "a", [0.1, 0.2, 0.4, 0.3], evals=[(0, 0.3), (4, 0.5)])
    b = _run(tmp_path, "b", [0.2, 0.2, 0.1, 0.3], evals=[(0, 0.3), (4, 0.2)])
    out = tmp_path / "plots" / "curves.png"
    result = CliRunner().invoke(
        cli, ["plot", a, b, "-m", "reward", "-m", "eval.accuracy", "--smooth", "2", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert not [f for f in os.listdir(out.parent) if f.startswith(".tmp-")]


def test_plot_errors_are_one_line(tmp_path):
    a = _run(tmp_path, "a", [0.1])
    result = CliRunner().invoke(cli, ["plot", a, "-m", "nope", "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: run ")
    with pytest.raises(DareError, match="one per run"):
        plot_runs([a], ["reward"], str(tmp_path / "x.png"), labels=["p", "q"])
