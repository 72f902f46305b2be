"""Tiny real training runs with tracking on: what TensorBoard and W&B (offline) hold must be what
``metrics.jsonl`` holds, step by step and evaluation by evaluation."""

from __future__ import annotations

import glob
import json
import math
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import dare_plugin_tracking
from dare_core import hookimpl
from dare_core.config import resolve, to_dict
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.testing.registries import build_for
from dare_core.train import train
from dare_plugin_tracking import tracked_run
from dare_plugin_tracking.config import TensorBoardConfig
from dare_plugin_tracking.writers import TensorBoardWriter, scalars

COMMON = [
    "task.name=digits",
    "task.num_eval=8",
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "rollout.steps=4",
    "eval.batch_size=8",
    "progress=false",
    "seed=3",
    "trainer.steps=4",
    "trainer.batch_size=2",
    "trainer.group_size=4",
    "eval.every=2",
    "trainer.save_final=false",
]


def _dare(*more):
    return build_for(toy, DigitsPlugin(rl_recipe={"trainer": {"lr": 3e-3}}), dare_plugin_tracking, *more)


def _config(dare, tmp_path, *overrides):
    return resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=COMMON + [f"model.path={tmp_path}", f"output_dir={tmp_path / 'runs'}", "run_name=r", *overrides],
    )


def _metrics(root) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(x) for x in (root / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "eval" not in x], [x for x in lines if "eval" in x]


def _tensorboard(log_dir) -> EventAccumulator:
    assert glob.glob(os.path.join(log_dir, "events.out.tfevents.*")), log_dir
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _f32(value: float) -> float:
    """``value`` as TensorBoard stores it (float32)."""
    return torch.tensor(value, dtype=torch.float32).item()


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_tensorboard_and_wandb_hold_the_values_of_metrics_jsonl(tmp_path, wandb_run):
    dare = _dare()
    cfg = _config(dare, tmp_path, "tracking.backends=[tensorboard, wandb]", "tracking.tags=[t1]")
    train(dare, cfg)
    root = tmp_path / "runs" / "r"
    steps, evals = _metrics(root)
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and [e["step"] for e in evals] == [0, 2, 4]
    expected: dict[int, dict[str, float]] = {}  # step -> every scalar logged at that step
    for line in steps:
        expected.setdefault(line["step"], {}).update(scalars({k: v for k, v in line.items() if k != "step"}))
    for line in evals:
        expected.setdefault(line["step"], {}).update(scalars(line["eval"], "eval/"))
    assert {"loss", "reward", "grad_norm", "eval/accuracy", "eval/vs_before/delta"} <= {
        k for row in expected.values() for k in row
    }

    # TensorBoard: one series per name, every value at its step (float32, as TensorBoard keeps it)
    acc = _tensorboard(root / "tensorboard")
    logged = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    want: dict[str, dict[int, float]] = {}
    for step, row in expected.items():
        for name, value in row.items():
            want.setdefault(name, {})[step] = value
    assert set(logged) == set(want)
    for name, series in want.items():
        assert set(logged[name]) == set(series), name
        assert all(_same(logged[name][s], _f32(v)) for s, v in series.items()), name
    assert logged["eval/accuracy"] == {e["step"]: _f32(e["eval"]["accuracy"]) for e in evals}
    assert "config/text_summary" in acc.Tags()["tensors"]  # the resolved config, as text

    # W&B (offline): the same rows, exact; the run's config is the resolved run config
    run = wandb_run(str(root))
    assert set(run["history"]) == set(expected)
    for step, row in expected.items():
        assert set(run["history"][step]) == set(row), step
        assert all(_same(run["history"][step][k], v) for k, v in row.items()), step
    last = expected[4]
    assert all(_same(run["summary"][k], v) for k, v in last.items())
    assert run["summary"]["eval/accuracy"] == evals[-1]["eval"]["accuracy"]
    data = json.loads(json.dumps(to_dict(cfg)))
    assert {k: run["config"][k] for k in data} == data
    assert run["config"]["tracking"]["backends"] == ["tensorboard", "wandb"]
    assert run["name"] == "r" and run["tags"] == ["t1"] and run["exit_code"] == 0
    assert tracked_run.active() is None


def test_writers_are_closed_after_an_error_and_wandb_marks_the_run_failed(tmp_path, wandb_run):
    class Boom(Exception):
        pass

    class FailAtStep2:
        @hookimpl
        def dare_on_step_end(self, step, metrics):
            if step == 2:
                raise Boom("stop")

    dare = _dare(FailAtStep2())
    cfg = _config(dare, tmp_path, "tracking.backends=[tensorboard, wandb]", "eval.before=false")
    with pytest.raises(Boom):
        train(dare, cfg)
    assert tracked_run.active() is None
    root = tmp_path / "runs" / "r"
    steps, _ = _metrics(root)
    acc = _tensorboard(root / "tensorboard")  # flushed on close: step 1 is there
    assert [(e.step, e.value) for e in acc.Scalars("loss")][0] == (1, _f32(steps[0]["loss"]))
    run = wandb_run(str(root))
    assert run["history"][1]["loss"] == steps[0]["loss"]
    assert run["exit_code"] == 1


def test_tracking_off_writes_no_tracker_files(tmp_path):
    dare = _dare()
    train(dare, _config(dare, tmp_path, "eval.every=0", "eval.before=false", "eval.after=false"))
    root = tmp_path / "runs" / "r"
    assert (root / "metrics.jsonl").is_file()
    assert not (root / "tensorboard").exists() and not (root / "wandb").exists()


def test_a_shared_tensorboard_dir_gets_one_subdirectory_per_run(tmp_path):
    dare = _dare()
    shared = tmp_path / "tb"
    train(
        dare,
        _config(
            dare,
            tmp_path,
            "tracking.backends=[tensorboard]",
            "eval.every=0",
            f"tracking.tensorboard.log_dir={shared}",
            "tracking.run_name=first",
        ),
    )
    acc = _tensorboard(shared / "first")
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3, 4]
    assert not (tmp_path / "runs" / "r" / "tensorboard").exists()


def test_nested_non_finite_and_non_numeric_metrics(tmp_path):
    values = scalars(
        {
            "loss": float("nan"),
            "grad_norm": float("inf"),
            "ok": True,
            "n": 3,
            "name": "text",
            "none": None,
            "list": [1.0],
            "vs": {"delta": -0.5, "p": 0.25},
        }
    )
    assert set(values) == {"loss", "grad_norm", "ok", "n", "vs/delta", "vs/p"}
    assert math.isnan(values["loss"]) and values["grad_norm"] == math.inf
    assert (values["ok"], values["n"], values["vs/delta"]) == (1.0, 3.0, -0.5)
    writer = TensorBoardWriter(TensorBoardConfig(), str(tmp_path), "r", {"algo": "x"})
    writer.log(values, 7)
    writer.close(failed=False)
    acc = _tensorboard(tmp_path / "tensorboard")
    assert math.isnan(acc.Scalars("loss")[0].value) and acc.Scalars("grad_norm")[0].value == math.inf
    assert [(e.step, e.value) for e in acc.Scalars("vs/delta")] == [(7, -0.5)]
