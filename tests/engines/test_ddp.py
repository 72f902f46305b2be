"""The core's data-parallel engine (``ddp``) on 2 gloo ranks equals one process on the same
global batch: weights and per-step metrics, for supervised training and the RL loop."""

import pytest

from dare_core.testing.engines import assert_same_as_single


@pytest.mark.parametrize("algo", ["sup_test", "pg_test"])
def test_two_ranks_equal_one_process(tmp_path, algo):
    one, many = assert_same_as_single(tmp_path, algo, ["engine.name=ddp"])
    assert len([r for r in one["records"] if "loss" in r]) == 3
    assert many["summary"]["world_size"] == 2


def test_two_ranks_equal_one_process_with_a_monte_carlo_accumulation_loss(tmp_path):
    """BGPO: its loss runs one backward per Monte-Carlo row (through the engine's backward), over
    a corruption stratified across the batch (drawn over the global batch on every rank)."""
    assert_same_as_single(tmp_path, "bgpo", ["engine.name=ddp"], plugins=("dare_plugin_bgpo",),
                          extra=["algorithm.mc_num=2", "algorithm.n_l=2"])
