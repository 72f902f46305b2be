"""The core's data-parallel engine (``ddp``) on 2 gloo ranks equals one process on the same
global batch: weights and per-step metrics, for supervised training and the RL loop."""

import pytest

from dare_core.testing.engines import assert_same_as_single


@pytest.mark.parametrize("algo", ["sup_test", "pg_test"])
def test_two_ranks_equal_one_process(tmp_path, algo):
    one, many = assert_same_as_single(tmp_path, algo, ["engine.name=ddp"])
    assert len([r for r in one["records"] if "loss" in r]) == 3
    assert many["summary"]["world_size"] == 2


def test_engine_timeout_bounds_how_long_a_collective_waits():
    """A rank that never reaches a collective stops the others after ``engine.timeout`` seconds,
    not after the late rank is gone (rank 1 sleeps 20 s; rank 0 waits 2)."""
    import os
    import sys

    from dare_core.testing.distributed import run_ranks

    sys.path.insert(0, os.path.dirname(__file__))  # the spawned ranks import refusal by name
    from refusal import timed_out_collective

    rank0 = run_ranks(2, timed_out_collective, 2.0, 20.0, timeout=120)[0]
    assert rank0["error"] is not None and rank0["waited"] < 12, rank0
