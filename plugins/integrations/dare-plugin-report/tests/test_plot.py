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
    with pytest.raises(DareError, match="has neither metrics.jsonl nor results.json"):
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


def _sft_run(tmp_path, name, losses):
    d = tmp_path / name
    d.mkdir()
    rows = [{"step": 0, "eval": {"accuracy": 0.2, "n": 10}}]
    rows += [{"step": i, "loss": v, "lr": 1e-3} for i, v in enumerate(losses, 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(d)


def _eval_dir(tmp_path, name, accuracies):
    d = tmp_path / name
    d.mkdir()
    tasks = {t: {"n": 10, "accuracy": a, "reward": a} for t, a in accuracies.items()}
    (d / "results.json").write_text(json.dumps({"model": "llada", "tasks": tasks}))
    return str(d)


def test_default_metrics_follow_the_run_kind(tmp_path):
    """RL runs plot their reward, SFT and preference runs their loss; both their accuracy."""
    from dare_plugin_report.plot import default_metrics

    assert default_metrics(_run(tmp_path, "rl", [0.1, 0.2], evals=[(0, 0.3)])) == ["reward", "eval.accuracy"]
    assert default_metrics(_sft_run(tmp_path, "sft", [2.0, 1.5])) == ["loss", "eval.accuracy"]


def test_plot_mixes_run_kinds_and_evaluation_directories(tmp_path):
    """``dare plot runs/*`` over an RL run, an SFT run and an evaluation directory: one panel per
    main metric, each drawing the runs that have it, and a bar panel of accuracy by task."""
    pytest.importorskip("matplotlib")
    rl = _run(tmp_path, "rl", [0.1, 0.2, 0.4], evals=[(0, 0.3), (3, 0.5)])
    sft = _sft_run(tmp_path, "sft", [2.0, 1.5, 1.2])
    ev = _eval_dir(tmp_path, "eval-llada", {"sudoku": 0.32, "countdown": 0.1})
    out = tmp_path / "curves.png"
    result = CliRunner().invoke(cli, ["plot", rl, sft, ev, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_damaged_evaluation_directory_is_one_line(tmp_path):
    d = tmp_path / "eval-x"
    d.mkdir()
    (d / "results.json").write_text("[]")
    result = CliRunner().invoke(cli, ["plot", str(d), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "results.json is not the results.json `dare eval` writes" in result.output
