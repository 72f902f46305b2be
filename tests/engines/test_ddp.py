"""The core's data-parallel engine (``ddp``) on 2 gloo ranks equals one process on the same
global batch: weights and per-step metrics, for supervised training and the RL loop."""

import pytest

from dare_core.testing.engines import assert_same_as_single


@pytest.mark.parametrize("algo", ["sup_test", "pg_test"])
def test_two_ranks_equal_one_process(tmp_path, algo):
    one, many = assert_same_as_single(tmp_path, algo, ["engine.name=ddp"])
    assert len([r for r in one["records"] if "loss" in r]) == 3
    assert many["summary"]["world_size"] == 2
