"""dare-plugin-bgpo: Boundary-Guided Policy Optimization (arXiv:2510.11683)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_bgpo.config import RECIPE, BGPOConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "bgpo",
            lazy("dare_plugin_bgpo.algorithm:BGPOLoss"),
            "per-row PPO with a linear ratio 1 + Δ for A > 0, gradients accumulated one MC row at a time",
            reference="arXiv:2510.11683",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="bgpo",
            workflow="rl",
            config_cls=BGPOConfig,
            build=lazy("dare_plugin_bgpo.algorithm:build"),
            requires=frozenset({"absorbing_elbo"}),  # its likelihood is the absorbing-state ELBO (sequence_elbo)
            components={
                "corruption": "stratified_count_masking",
                "estimator": "sequence_elbo",
                "loss": "bgpo",
                "advantage": "group_norm",
                "trajectory": "final_sequence",
            },
            paper="arXiv:2510.11683",
            description="BGPO: many-sample ELBO with a linear lower-bound ratio; memory constant in mc_num",
            recipe=RECIPE,
        )
    )
