"""The rollout-engine seam: a backend declaring ``RolloutSpec.sync`` gets the updated policy after
every RL step, and a run whose rollouts come from such an engine equals the in-process run.

The engine here is a test double that keeps its own copy of the model and generates from that copy
only (as an external engine does); it learns the policy solely through ``load_weights``.
"""

import copy
import json
import os

import pytest
import torch

import dare_plugin_samplers
import dare_plugin_tasks
from dare_core.api import RolloutSpec, hookimpl
from dare_core.config import resolve
from dare_core.models import lora
from dare_core.plugins import build
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.train import train
from dare_plugin_samplers.config import LowConfidenceConfig
from dare_plugin_samplers.low_confidence import LowConfidenceSampler

PUSHES: list = []


class CopyEngine:
    """Generates from a private copy of the policy, refreshed only by ``load_weights``."""

    def __init__(self, config, how):
        self.sampler = LowConfidenceSampler(config)
        self.how = how
        self.copy = None

    def generate(self, wrapper, prompt_ids, prompt_mask, *, record=frozenset(), generator=None):
        if self.copy is None:  # started from the policy the run starts with (adapters merged)
            self.copy = copy.deepcopy(wrapper)
            if lora.is_lora(self.copy):
                self.copy.module = self.copy.module.merge_and_unload()
        return self.sampler.generate(self.copy, prompt_ids, prompt_mask, record=record, generator=generator)

    def load_weights(self, weights, step):
        if self.how == "directory":
            assert isinstance(weights, str) and os.path.isfile(os.path.join(weights, "toy.pt"))
            state = toy.load(weights).module.state_dict()
        else:
            state = dict(weights)
        PUSHES.append((self.how, step, {k: v.clone() for k, v in state.items()}))
        if self.copy is not None:
            self.copy.module.load_state_dict(state)


class EnginePlugin:
    @hookimpl
    def dare_register_rollout_backends(self, register):
        for how in ("state", "directory"):
            register(
                RolloutSpec(
                    name=f"engine_{how}",
                    config_cls=LowConfidenceConfig,
                    build=lambda cfg, how=how: CopyEngine(cfg, how),
                    kinds=frozenset({"masked"}),
                    sync=how,
                )
            )


@pytest.fixture
def dare():
    return build(
        load_entrypoints=False,
        extra_plugins=[
            dare_plugin_samplers,
            dare_plugin_tasks,
            toy,
            EnginePlugin(),
            DigitsPlugin(rl_recipe={"trainer": {"lr": 3e-3}}),
        ],
    )


def _run(dare, tmp_path, name, backend, extra=()):
    os.makedirs(tmp_path / "ckpt", exist_ok=True)
    cfg = resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=[
            "task.name=digits",
            "task.num_eval=8",
            "rollout.gen_length=4",
            "rollout.block_length=4",
            "rollout.steps=4",
            "rollout.temperature=1.0",
            "eval.batch_size=8",
            "progress=false",
            "seed=5",
            f"model.path={tmp_path / 'ckpt'}",
            f"output_dir={tmp_path}",
            f"run_name={name}",
            "trainer.steps=3",
            "trainer.batch_size=4",
            "trainer.group_size=4",
            f"rollout.backend={backend}",
            *extra,
        ],
    )
    train(dare, cfg)
    metrics = [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    def timeless(d):
        return {
            k: timeless(v) if isinstance(v, dict) else v
            for k, v in d.items()
            if not (k.startswith("time") or k == "seconds" or "per_s" in k)
        }

    return [timeless(m) for m in metrics]


@pytest.mark.parametrize("how", ["state", "directory"])
def test_engine_rollouts_follow_the_policy(dare, tmp_path, how):
    PUSHES.clear()
    reference = _run(dare, tmp_path, "inproc", "low_confidence")
    synced = _run(dare, tmp_path, f"engine-{how}", f"engine_{how}")
    # every step's rollouts came from the engine's copy, so equal metrics mean the copy was the policy
    assert synced == reference
    # pushed as the run starts and after each of the 3 steps, to the training and the evaluation engine
    assert [(h, step) for h, step, _ in PUSHES] == [(how, s) for s in (0, 0, 1, 1, 2, 2, 3, 3)]
    final = toy.load(str(tmp_path / f"engine-{how}" / "final")).module.state_dict()
    last = PUSHES[-1][2]
    assert set(last) == set(final) and all(torch.equal(last[k], final[k]) for k in final)
    if how == "directory":
        assert (tmp_path / f"engine-{how}" / "rollout-policy" / "toy.pt").is_file()


def test_an_unsynced_engine_copy_would_diverge(dare, tmp_path, monkeypatch):
    """The equality above is not vacuous: without the pushes the engine's rollouts differ."""
    PUSHES.clear()
    reference = _run(dare, tmp_path, "inproc", "low_confidence")
    monkeypatch.setattr(CopyEngine, "load_weights", lambda self, weights, step: None)
    stale = _run(dare, tmp_path, "stale", "engine_state")
    assert stale[0] == reference[0] and stale[1:] != reference[1:]


def test_lora_policy_is_pushed_merged(dare, tmp_path):
    PUSHES.clear()
    adapters = [
        "model.lora.rank=4",
        "model.lora.alpha=8",
        "model.lora.target_modules=[mlp.0,mlp.2,head]",
        "trainer.lr=5e-2",
    ]
    reference = _run(dare, tmp_path, "inproc", "low_confidence", adapters)
    synced = _run(dare, tmp_path, "engine", "engine_state", adapters)
    assert synced == reference
    names = set(toy.make_toy_wrapper().module.state_dict())
    assert all(set(state) == names for _, _, state in PUSHES)  # the base model's names, no lora_ tensors
