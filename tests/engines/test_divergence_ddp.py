"""Divergence on 2 gloo ranks: a loss that is NaN on one rank only stops both ranks at the same
step (the stop decision is taken on the metrics reduced over ranks)."""

import json
import os
import sys

from dare_core.testing.distributed import run_ranks
from dare_core.testing.engines import TINY

sys.path.insert(0, os.path.dirname(__file__))  # the spawned ranks import nan_on_rank by name
from nan_on_rank import train_until_diverged  # noqa: E402


def test_both_ranks_stop_at_the_same_step(tmp_path):
    overrides = [
        *TINY,
        "engine.name=ddp",
        "trainer.steps=5",
        "trainer.max_nonfinite_steps=2",
        f"model.path={tmp_path / 'ckpt'}",
        f"output_dir={tmp_path}",
        "run_name=nan",
    ]
    messages = run_ranks(2, train_until_diverged, overrides)
    assert messages[0] is not None and messages[0] == messages[1]
    assert messages[0].startswith("training diverged at step 2: non-finite loss for 2 steps")
    lines = (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["loss"] is None and r["nonfinite"] == ["loss"] and r["skipped_steps"] == 0 for r in records)
    assert not (tmp_path / "nan" / "final").exists()
