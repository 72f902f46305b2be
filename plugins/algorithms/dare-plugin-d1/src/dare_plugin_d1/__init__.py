"""dare-plugin-d1: d1 / diffu-GRPO (arXiv:2504.12216)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, RolloutNeeds, hookimpl, lazy
from dare_plugin_d1.config import RECIPE, D1Config, eos_truncation

__version__ = "0.1.0"


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "d1_masking",
            lazy("dare_plugin_d1.algorithm:D1Masking"),
            "valid prompt tokens noised (wrapper.noise) with probability p, the whole response noised",
            kinds=frozenset({"masked"}),
            reference="arXiv:2504.12216",
        )
    )


@hookimpl
def dare_register_trajectory_builders(register):
    register(
        ComponentSpec(
            "d1_completion",
            lazy("dare_plugin_d1.algorithm:CompletionRows"),
            "final sequence, whole completion attended, loss weights = the response mask (to the first EOS)",
            kinds=frozenset({"masked"}),
            reference="arXiv:2504.12216",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="d1",
            workflow="rl",
            config_cls=D1Config,
            build=lazy("dare_plugin_d1.algorithm:build"),
            kinds=frozenset({"masked"}),
            components={
                "corruption": "d1_masking",
                "trajectory": "d1_completion",
                "estimator": "response_token_logprob",
                "loss": "clipped_pg",
                "advantage": "group_norm",
            },
            paper="arXiv:2504.12216",
            description="diffu-GRPO: GRPO with a one-step mean-field log-prob estimate",
            recipe=RECIPE,
            rollout=RolloutNeeds(fields=frozenset({"truncate_at_eos"}), adjust=eos_truncation),
        )
    )
