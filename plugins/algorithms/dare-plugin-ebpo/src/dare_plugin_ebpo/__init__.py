"""dare-plugin-ebpo: ELBO-based Block-level Policy Optimization (arXiv:2602.08676)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_ebpo.config import RECIPE, EBPOConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "block_elbo_masking",
            lazy("dare_plugin_ebpo.algorithm:BlockELBOMasking"),
            "every response block masked in every row at cyclically stratified levels, k = min(floor(t n) + 1, n)",
            kinds=frozenset({"block"}),
            reference="arXiv:2602.08676",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "ebpo",
            lazy("dare_plugin_ebpo.algorithm:EBPOLoss"),
            "PPO clip applied once to the sequence ratio of composite ELBOs (log space)",
            reference="arXiv:2602.08676",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="ebpo",
            workflow="rl",
            config_cls=EBPOConfig,
            build=lazy("dare_plugin_ebpo.algorithm:build"),
            kinds=frozenset({"block"}),
            requires=frozenset({"absorbing_elbo"}),  # the composite block ELBO is the absorbing-state one
            components={
                "corruption": "block_elbo_masking",
                "estimator": "sequence_elbo",
                "loss": "ebpo",
                "advantage": "group_norm",
                "trajectory": "final_sequence",
            },
            paper="arXiv:2602.08676",
            description="EBPO: composite block ELBO with sequence-level log-space PPO clipping",
            recipe=RECIPE,
        )
    )
