"""Test-only plugins and fixtures for the core tests.

Every registry here is built with ``build(load_entrypoints=False, extra_plugins=[...])`` from the
core's default plugins, the reference samplers and tasks (``dare-plugin-samplers``,
``dare-plugin-tasks``: a loop needs a rollout backend, the default config a task), the family-free ``toy`` family and the small plugins below, so the core tests never
depend on which plugins happen to be installed.

The plugins are module objects holding ``@hookimpl`` functions, exactly like a real plugin's
``__init__``: they use every registration hook (dare_register_model_wrappers,
dare_register_corruptions, dare_register_trajectory_builders,
dare_register_likelihood_estimators, dare_register_policy_losses,
dare_register_advantage_estimators, dare_register_rollout_backends, dare_register_algorithms,
dare_register_tasks) and dare_register_commands; plugin-owned config sections
(dare_register_config_sections) are registered by the tests that use them.
"""

from __future__ import annotations

import types
from typing import Any, Literal

import attrs
import click
import pytest

import dare_core.plugins as dare_plugins
import dare_core.testing.toy as toy
import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task (sudoku) and its reward
from dare_core import hookimpl
from dare_core.components import (
    ClippedPolicyLoss,
    FinalSequence,
    GroupNormAdvantage,
    RandomRatioMasking,
    ResponseTokenLogProb,
)
from dare_core.config import option
from dare_core.config.validators import in_range, non_negative, positive
from dare_core.interfaces import (
    AlgorithmSpec,
    ComponentSpec,
    ModelFamily,
    RLComponents,
    RolloutSpec,
    TaskSpec,
)


def make_plugin(name: str, **hooks: Any) -> types.ModuleType:
    """A plugin module called ``name`` holding ``hooks`` (hook name -> function)."""
    mod = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(mod, hook_name, hookimpl(fn))
    return mod


# ----------------------------------------------------------------------------- algorithms
@attrs.frozen
class AlgoAConfig:
    """Options of the test algorithm ``algo_a``."""

    clip_ratio_low: float = option(0.2, "PPO clip epsilon below 1.", in_range(0.0, 1.0, high_open=True))
    clip_ratio_high: float = option(0.28, "PPO clip epsilon above 1.", non_negative)
    mc_num: int = option(1, "Corruption draws per rollout batch.", positive)
    max_mc: int = option(4, "Upper bound of mc_num (checked by a validator reading self).", positive)
    norm_adv_by_std: bool = option(True, "Divide group-centred rewards by the group std.")
    agg: Literal["token-mean", "seq-mean-token-mean"] = option("token-mean", "Token-loss aggregation.")
    tags: frozenset[str] = option(frozenset({"x"}), "Free-form labels (a set: YAML round trip).")
    stages: tuple[int, ...] = option((1, 2), "Increasing stage boundaries (a tuple).")

    @mc_num.validator
    def _mc_within_bound(self, attribute, value):
        if value > self.max_mc:
            raise ValueError(f"must be <= max_mc ({self.max_mc}), got {value}")

    def __attrs_post_init__(self):
        if list(self.stages) != sorted(self.stages):
            raise ValueError(f"stages must be increasing, got {list(self.stages)}")


@attrs.frozen
class NoOptions:
    """An algorithm without options."""


def build_algo_a(cfg: AlgoAConfig, lookup) -> RLComponents:
    return RLComponents(
        corruption=lookup.corruption("random_ratio", mc_num=cfg.mc_num),
        estimator=lookup.estimator("response_token_logprob"),
        loss=lookup.loss(
            "clipped_pg", clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high, agg=cfg.agg
        ),
        advantage=lookup.advantage("group_norm", norm_by_std=cfg.norm_adv_by_std),
    )


def _no_build(cfg, lookup):  # pragma: no cover - never built in these tests
    raise AssertionError("not built in core tests")


RECIPE_A = {"trainer": {"lr": 1e-4, "steps": 3, "batch_size": 4, "group_size": 2}}
A_COMPONENTS = {
    "corruption": "random_ratio",
    "estimator": "response_token_logprob",
    "loss": "clipped_pg",
    "advantage": "group_norm",
}


def _register_algorithms(register):
    register(
        AlgorithmSpec(
            name="algo_a",
            workflow="rl",
            config_cls=AlgoAConfig,
            build=build_algo_a,
            kinds=frozenset({"masked"}),
            components=dict(A_COMPONENTS),
            paper="test paper",
            description="test RL algorithm composed from core components",
            recipe=RECIPE_A,
        )
    )
    register(
        AlgorithmSpec(
            name="algo_block",
            workflow="rl",
            config_cls=NoOptions,
            build=_no_build,
            kinds=frozenset({"block"}),
            description="needs a block-diffusion family",
        )
    )
    register(
        AlgorithmSpec(
            name="algo_cache",
            workflow="rl",
            config_cls=NoOptions,
            build=_no_build,
            requires=frozenset({"kv_cache"}),
            description="needs the kv_cache capability",
        )
    )
    register(
        AlgorithmSpec(
            name="algo_sft",
            workflow="sft",
            config_cls=NoOptions,
            build=_no_build,
            description="test SFT algorithm",
        )
    )


# ----------------------------------------------------------------------------- families
LOAD_CALLS: list[tuple] = []


def recording_load(path, *args, **kwargs):
    LOAD_CALLS.append((path, args, kwargs))
    raise AssertionError("a core test loaded a model")


def _register_model_wrappers(register):
    register(
        ModelFamily(
            name="toy_cached",
            kind="masked",
            load=recording_load,
            capabilities=frozenset({"bidirectional", "kv_cache", "mask_token", "absorbing_elbo"}),
            default_rollout="low_confidence",
            rollouts=("low_confidence", "cached"),
            description="masked test family with a cache",
        )
    )
    register(
        ModelFamily(
            name="toy_block",
            kind="block",
            load=recording_load,
            block_size=4,
            default_rollout="block_only",
            description="block-diffusion test family",
        )
    )


# ----------------------------------------------------------------------------- rollouts
@attrs.frozen
class MiniRolloutConfig:
    """A rollout config without ``block_length``."""

    gen_length: int = option(64, "Response length.", positive)
    steps: int = option(64, "Denoising steps.", positive)
    temperature: float = option(0.0, "Sampling temperature.", non_negative)


def _register_rollout_backends(register):
    register(
        RolloutSpec(
            name="mini",
            config_cls=MiniRolloutConfig,
            build=lambda cfg: cfg,
            kinds=frozenset({"masked"}),
            description="test backend",
        )
    )
    register(
        RolloutSpec(
            name="block_only",
            config_cls=MiniRolloutConfig,
            build=lambda cfg: cfg,
            kinds=frozenset({"block"}),
            description="block-diffusion test backend",
        )
    )
    register(
        RolloutSpec(
            name="cached",
            config_cls=MiniRolloutConfig,
            build=lambda cfg: cfg,
            kinds=frozenset({"masked"}),
            requires=frozenset({"kv_cache"}),
            records=frozenset({"reveal_step"}),
            description="needs kv_cache",
        )
    )


# ----------------------------------------------------------------------------- components, tasks
def _register_corruptions(register):
    register(ComponentSpec("test_corruption", RandomRatioMasking, "test corruption"))


def _register_trajectory_builders(register):
    register(ComponentSpec("test_trajectory", FinalSequence, "test trajectory builder"))


def _register_likelihood_estimators(register):
    register(ComponentSpec("test_estimator", ResponseTokenLogProb, "test estimator"))


def _register_policy_losses(register):
    register(ComponentSpec("test_loss", ClippedPolicyLoss, "test loss"))


def _register_advantage_estimators(register):
    register(ComponentSpec("test_advantage", GroupNormAdvantage, "test advantage"))


def _register_tasks(register):
    register(TaskSpec(name="echo_task", build=lambda cfg: None, description="test task"))


@click.command("hello")
@click.option("--name", default="world")
def hello_command(name: str) -> None:
    """Say hello (a plugin command)."""
    click.echo(f"hello {name}")


def _register_commands(cli):
    cli.add_command(hello_command)


def test_plugins() -> list[types.ModuleType]:
    """The test plugins, in registration order (the reference samplers and ``toy`` first)."""
    return [
        dare_plugin_samplers,
        dare_plugin_tasks,
        toy,
        make_plugin("test_families", dare_register_model_wrappers=_register_model_wrappers),
        make_plugin("test_algorithms", dare_register_algorithms=_register_algorithms),
        make_plugin("test_rollouts", dare_register_rollout_backends=_register_rollout_backends),
        make_plugin(
            "test_components",
            dare_register_corruptions=_register_corruptions,
            dare_register_trajectory_builders=_register_trajectory_builders,
            dare_register_likelihood_estimators=_register_likelihood_estimators,
            dare_register_policy_losses=_register_policy_losses,
            dare_register_advantage_estimators=_register_advantage_estimators,
        ),
        make_plugin("test_tasks", dare_register_tasks=_register_tasks),
        make_plugin("test_commands", dare_register_commands=_register_commands),
    ]


test_plugins.__test__ = False  # a helper, not a test


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture
def load_calls():
    """Calls of every test family's ``load`` (including ``toy``'s, patched here)."""
    LOAD_CALLS.clear()
    yield LOAD_CALLS
    LOAD_CALLS.clear()


@pytest.fixture
def make_dare(monkeypatch, load_calls):
    """``make_dare(*more_plugins)``: registries from the core defaults, the test plugins and
    ``more_plugins``; the toy family's ``load`` records its calls instead of loading."""
    monkeypatch.setattr(toy, "load", recording_load)

    def make(*more: Any, default_plugins: bool = True):
        return dare_plugins.build(
            load_entrypoints=False, extra_plugins=[*test_plugins(), *more], default_plugins=default_plugins
        )

    return make


@pytest.fixture
def dare(make_dare):
    return make_dare()


@pytest.fixture
def ckpt(tmp_path):
    """An (empty) checkpoint directory; the toy family ships no bundled checkpoint."""
    path = tmp_path / "ckpt"
    path.mkdir()
    return path


@pytest.fixture
def use_dare(monkeypatch):
    """``use_dare(d)`` makes ``get_dare()`` (and so the CLI) return ``d``; undone afterwards,
    together with any plugin commands added to the global click group."""
    from dare_core.cli import cli

    monkeypatch.setattr(cli, "commands", dict(cli.commands))
    monkeypatch.setattr(cli, "_plugins_loaded", False, raising=False)

    def use(d):
        monkeypatch.setattr(dare_plugins, "_DARE", d)
        return d

    yield use


@pytest.fixture(name="make_plugin")
def make_plugin_fixture():
    """``make_plugin(name, hook_name=function, ...)`` → a plugin module."""
    return make_plugin
