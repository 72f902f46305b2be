"""`judged_by_training_rollout`: evaluating a run with the sampler it trains with."""

import attrs
import pytest

import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core.config import resolve
from dare_core.errors import DareError
from dare_core.plugins import build
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.workflows.runtime import eval_backend_name
from dare_plugin_report.compare import judged_by_training_rollout

COMMON = [
    "task.name=digits",
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "rollout.steps=2",
    "rollout.temperature=0.8",
    "progress=false",
]


@pytest.fixture
def dare():
    return build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, DigitsPlugin()])


def test_eval_takes_the_training_rollout(dare, tmp_path):
    cfg = resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=COMMON
        + [f"model.path={tmp_path}", "eval.steps=4", "eval.temperature=0.0", "eval.backend=low_confidence"],
    )
    judged = judged_by_training_rollout(dare, cfg)
    assert judged.eval.backend is None and eval_backend_name(judged) == cfg.rollout_backend
    assert judged.eval_rollout == cfg.rollout  # steps 2 and T 0.8, not eval's 4 and 0
    assert attrs.evolve(judged, eval=cfg.eval, eval_rollout=cfg.eval_rollout) == cfg  # nothing else changes


def test_needs_the_runs_algorithm(dare, tmp_path):
    cfg = resolve(dare, model="toy", overrides=COMMON + [f"model.path={tmp_path}"], need_algo=False)
    with pytest.raises(DareError, match="needs the run's algorithm"):
        judged_by_training_rollout(dare, cfg)
