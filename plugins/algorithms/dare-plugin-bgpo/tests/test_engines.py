"""BGPO on 2 data-parallel ranks (the core's ddp engine) equals one process on the same global
batch: its loss runs one backward per Monte-Carlo row through the engine's backward, over a
corruption stratified across the batch (drawn over the global batch on every rank)."""

from dare_core.testing.engines import assert_same_as_single


def test_two_ranks_equal_one_process(tmp_path):
    assert_same_as_single(
        tmp_path,
        "bgpo",
        ["engine.name=ddp"],
        plugins=("dare_plugin_bgpo",),
        extra=["algorithm.mc_num=2", "algorithm.n_l=2"],
    )
