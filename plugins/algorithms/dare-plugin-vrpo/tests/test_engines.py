"""VRPO (the preference workflow) trains on 2 data-parallel ranks: pairs generated from the
model's own rollouts (the same on every rank), each rank training on its half of every batch."""

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
        "preference.gen_prompts=16",
        "preference.gen_eval_prompts=8",
        "preference.num_eval=4",
        "preference.gen_samples=4",
        "algorithm.mc_num=2",
    ]
    result = run_ranks(2, train_run, ("dare_plugin_vrpo",), "vrpo", overrides)[0]
    steps = [r for r in result["records"] if "loss" in r]
    assert len(steps) == 3 and all(math.isfinite(r["loss"]) for r in steps)
    assert all(r["pairs"] == 4 for r in steps)  # the global batch, 2 pairs per rank
    assert any("eval_pairs" in r for r in result["records"])
