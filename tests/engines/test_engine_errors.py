"""Bad engine input: one line naming the problem and the fix, exit status 2, before any work
(no run directory is created)."""

import os

import pytest

import dare_plugin_samplers
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.testing.registries import build_for

BASE = ["task.name=digits", "rollout.gen_length=4", "rollout.block_length=4", "progress=false", "model.device=cpu"]


@pytest.fixture
def invoke(dare_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = dare_cli(build_for(toy, DigitsPlugin(), dare_plugin_samplers))
    return lambda *overrides: run(
        "train",
        "--algo",
        "sup_test",
        "--model",
        "toy",
        *BASE,
        f"model.path={tmp_path / 'ckpt'}",
        f"output_dir={tmp_path / 'runs'}",
        *overrides,
    )


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["engine.name=fsdq"], "engine.name: unknown engine 'fsdq'; installed: ddp, single"),
        (
            ["engine.name=ddp"],
            "engine.name=ddp runs one process per device and needs RANK and WORLD_SIZE "
            "from its launcher; start one process per device with a launcher, e.g. torchrun",
        ),
        (["engine.precision=bf16"], "engine.precision=bf16 with engine.bf16_update=none would lose"),
        (["engine.precision=fp16"], "engine.precision"),
        (["trainer.resume=/nonexistent/step-3"], "trainer.resume=/nonexistent/step-3: no training checkpoint there"),
        (["trainer.resume=auto"], "trainer.resume=auto continues the run named by run_name; set run_name"),
    ],
)
def test_bad_engine_input_is_one_line_before_any_work(invoke, tmp_path, overrides, expected):
    result = invoke(*overrides)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")


def test_a_world_size_that_does_not_divide_the_batch_is_refused(invoke, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    from dare_core.engines import distributed
    from dare_core.engines.single import LocalGroup

    class ThreeRanks(LocalGroup):  # the process group itself is not needed to check the batch split
        world_size = 3
        device = "cpu"

    monkeypatch.setattr(distributed, "ProcessGroup", lambda config: ThreeRanks())
    result = invoke("engine.name=ddp", "trainer.batch_size=4")
    assert result.exit_code == 2
    assert (
        "trainer.batch_size=4 cannot be split over 3 processes; make it a multiple of the world size" in result.output
    )
