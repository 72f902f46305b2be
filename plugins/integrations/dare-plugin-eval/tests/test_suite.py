"""``dare eval`` with the toy family: several tasks equal each task alone, the eval directory's
files, sampled evaluation with pass@k / maj@k, and bad input refused in one line before any work."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from dare_core.api import resolve
from dare_plugin_eval import suite as suite_mod

TASKS = ("digits", "first_digit")


def _ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def _json(result) -> dict:
    return json.loads(_ok(result).strip().splitlines()[-1])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line[len("error: ") :]


def _timeless(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("seconds",)}


def test_several_tasks_equal_each_task_alone(dare_eval, overrides):
    both = _json(dare_eval("--tasks", ",".join(TASKS), "--json", *overrides))
    assert list(both["tasks"]) == list(TASKS)
    for task in TASKS:
        alone = _json(dare_eval("--json", f"task.name={task}", *overrides))
        assert list(alone["tasks"]) == [task]
        assert _timeless(alone["tasks"][task]) == _timeless(both["tasks"][task])
    assert both["tasks"]["digits"]["n"] == 5 and both["tasks"]["digits"]["nfe"] == 2 * 2  # 2 batches x 2 steps


def test_the_eval_directory(dare_eval, overrides, tmp_path):
    out = _ok(dare_eval("--tasks", ",".join(TASKS), *overrides, "run_name=mine"))
    root = tmp_path / "out" / "mine"
    assert out.strip().splitlines()[-1] == f"wrote {root}"
    header = out.splitlines()[0].split()
    assert header[:5] == ["task", "n", "accuracy", "reward", "pass@1"] and "kinds" in header
    results = json.loads((root / "results.json").read_text())
    assert results["samples"] == 1 and results["k"] == [1] and results["model"] == "toy"
    assert results["config"]["task"]["name"] == "digits"
    assert yaml.safe_load((root / "config.yaml").read_text()) == results["config"]
    lines = [json.loads(line) for line in (root / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 10
    assert all(
        set(r) == {"task", "item", "sample", "prompt", "response", "pred", "score", "acc", "kind"} for r in lines
    )
    assert [(r["task"], r["item"], r["sample"]) for r in lines] == [(t, i, 0) for t in TASKS for i in range(5)]
    assert lines[6]["prompt"] == "n1"  # item 1 of the held-out prompts n0, n1, ...
    for task in TASKS:
        rows = [r for r in lines if r["task"] == task]
        assert results["tasks"][task]["accuracy"] == sum(r["acc"] for r in rows) / 5
    kinds = [r["kind"] for r in lines if r["task"] == "first_digit"]
    assert results["tasks"]["first_digit"]["kinds"] == {k: kinds.count(k) for k in sorted(set(kinds))}
    assert "kinds" not in results["tasks"]["digits"] and "maj@1" not in results["tasks"]["first_digit"]
    again = dare_eval("--tasks", "digits", *overrides, "run_name=mine")  # a run_name is claimed once
    assert "mine exists" in _one_line_error(again)
    _ok(dare_eval("--tasks", "digits", *overrides, "run_name=mine", "--overwrite"))
    assert json.loads((root / "results.json").read_text())["k"] == [1]


def test_sampled_evaluation_reports_pass_and_maj_at_k(dare_eval, overrides, tmp_path):
    res = _json(
        dare_eval(
            "--tasks",
            "first_digit",
            "--samples",
            "4",
            "--k",
            "1,2,4",
            "--json",
            *overrides,
            "eval.temperature=1.0",
            "run_name=s",
        )
    )
    m = res["tasks"]["first_digit"]
    assert res["samples"] == 4 and res["k"] == [1, 2, 4] and m["n"] == 5
    assert {"pass@1", "pass@2", "pass@4", "maj@2", "maj@4"} <= set(m)
    lines = [json.loads(line) for line in (tmp_path / "out" / "s" / "samples.jsonl").read_text().splitlines()]
    assert [(r["item"], r["sample"]) for r in lines] == [(i, s) for i in range(5) for s in range(4)]
    assert m["pass@1"] == pytest.approx(sum(r["acc"] for r in lines) / 20)
    assert m["accuracy"] == sum(r["acc"] for r in lines if r["sample"] == 0) / 5
    assert m["pass@1"] <= m["pass@2"] <= m["pass@4"]
    assert len({r["response"] for r in lines}) > 1  # sampled, not greedy


def test_bad_input_is_one_line_before_the_model_loads(dare_eval, overrides, tmp_path, monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a refused evaluation loaded the model")

    monkeypatch.setattr(suite_mod, "eval_context", loaded)
    cases = {
        ("--tasks", "digits,first_digt"): "first_digit",  # the unknown name, with the close match
        ("--tasks", "digits,,first_digit"): "empty name",
        ("--tasks", "digits,digits"): "digits more than once",
        ("--samples", "2", "--k", "1,3", "eval.temperature=1.0"): "--k 3 is outside 1..2",
        ("--samples", "0"): "--samples must be at least 1",
        ("--k", "1,x"): "comma-separated list of whole numbers",
        ("--samples", "4"): "set eval.temperature above 0",
        ("--tasks", "digits,first_digit", "task.eval_path=x.jsonl"): "task.eval_path names one task's data",
    }
    for args, expected in cases.items():
        message = _one_line_error(dare_eval(*args, *overrides))
        assert expected in message, (args, message)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_a_refused_checkpoint_leaves_no_eval_directory(dare, overrides, tmp_path, monkeypatch):
    from dare_core.api import DareError

    def refuse(*args, **kwargs):
        raise DareError("no such checkpoint")

    monkeypatch.setattr(suite_mod, "eval_context", refuse)
    with pytest.raises(DareError, match="no such checkpoint"):
        suite_mod.run_suite(dare, "toy", [None], overrides=overrides)
    assert os.listdir(tmp_path / "out") == []


def test_one_task_by_default_is_the_configs(dare, overrides):
    cfg = resolve(dare, model="toy", overrides=overrides, need_algo=False)
    res = suite_mod.run_suite(dare, "toy", [None], overrides=[*overrides, "task.name=first_digit"])
    assert list(res["tasks"]) == ["first_digit"] and cfg.task.name != "first_digit"
