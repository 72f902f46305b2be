"""ComponentLookup builds an algorithm's components by the roles its spec declares; the run
config carries the training and evaluation rollout configs, derived once."""

import attrs
import pytest

import dare_plugin_samplers
from dare_core.components import ComponentLookup, FinalSequence, GroupNormAdvantage
from dare_core.components.losses import ClippedPolicyLoss
from dare_core.config import resolve
from dare_core.errors import ConfigError, DareError
from dare_core.interfaces import AlgorithmSpec, RLComponents, RolloutNeeds, SFTComponents
from dare_core.plugins import build, hookimpl
from dare_core.testing import toy
from dare_core.testing.digits import ClipConfig, DigitsPlugin, pg_components
from dare_core.testing.registries import build_for


@pytest.fixture
def registries():
    return build(load_entrypoints=False).registries


def test_a_declared_role_is_built_without_its_name(registries):
    lookup = ComponentLookup(registries, components={"loss": "clipped_pg"})
    assert isinstance(lookup.loss(clip_ratio_low=0.1), ClippedPolicyLoss)
    assert isinstance(lookup.trajectory(), FinalSequence)  # not listed: the default
    assert lookup.built == ["clipped_pg", "final_sequence"]


def test_an_undeclared_name_is_refused_in_one_line(registries):
    lookup = ComponentLookup(registries, components={"loss": "clipped_pg"})
    with pytest.raises(DareError, match="'random_ratio' is not declared in AlgorithmSpec.components"):
        lookup.corruption("random_ratio")


def test_alternatives_need_the_chosen_name(registries):
    lookup = ComponentLookup(registries, components={"estimator": ("response_token_logprob", "masked_token_logprob")})
    with pytest.raises(DareError, match="declared: response_token_logprob, masked_token_logprob"):
        lookup.estimator()
    assert lookup.estimator("masked_token_logprob") is not None


def test_defaults_come_from_the_registry(registries):
    comps = RLComponents(estimator=None, loss=None)
    filled = ComponentLookup(registries).with_defaults(comps)
    assert isinstance(filled.trajectory, FinalSequence) and isinstance(filled.advantage, GroupNormAdvantage)
    assert ComponentLookup(registries).with_defaults(filled) is filled
    sft = SFTComponents(estimator=None, loss=None)  # a bundle without those roles is left as is
    assert ComponentLookup(registries).with_defaults(sft) is sft


def _tripled(cfg, rollout_cfg):
    return attrs.evolve(rollout_cfg, steps=3 * rollout_cfg.steps)


class AdjustingPlugin:
    @hookimpl
    def dare_register_algorithms(self, register):
        register(
            AlgorithmSpec(
                "tripled_test",
                "rl",
                ClipConfig,
                pg_components,
                rollout=RolloutNeeds(fields=frozenset({"steps"}), adjust=_tripled),
            )
        )


def _resolve(tmp_path, *over):
    dare = build_for(toy, DigitsPlugin(), AdjustingPlugin(), dare_plugin_samplers)
    base = ["task.name=digits", "rollout.backend=low_confidence", "rollout.gen_length=4", "rollout.block_length=4"]
    base.append(f"model.path={tmp_path}")
    return resolve(dare, algo="tripled_test", model="toy", overrides=base + list(over))


def test_training_and_evaluation_rollouts_are_derived_once(tmp_path):
    cfg = _resolve(tmp_path, "rollout.steps=2", "eval.steps=4", "eval.temperature=0.0")
    assert cfg.rollout.steps == 2 and cfg.train_rollout.steps == 6
    assert (cfg.eval_rollout.steps, cfg.eval_rollout.temperature) == (4, 0.0)


def test_resolved_rollouts_are_not_config_keys(tmp_path):
    with pytest.raises(ConfigError, match="train_rollout: resolved from the rollout and eval sections"):
        _resolve(tmp_path, "train_rollout.steps=9")
