"""CJ-GRPO (a trajectory algorithm: the rollout records every step's state) trains on 2
data-parallel ranks: one generate call per rank (its records are not joined across calls)."""

import math

from dare_core.testing.distributed import run_ranks
from dare_core.testing.engines import TINY, train_run


def test_trains_on_two_ranks(tmp_path):
    overrides = [
        *TINY,
        f"model.path={tmp_path / 'ckpt'}",
        f"output_dir={tmp_path}",
        "run_name=two",
        "engine.name=ddp",
        "trainer.rollout_batch_size=0",
    ]
    result = run_ranks(2, train_run, ("dare_plugin_cj_grpo",), "cj_grpo", overrides)[0]
    steps = [r for r in result["records"] if "loss" in r]
    assert len(steps) == 3 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in steps)
    assert result["summary"]["world_size"] == 2
