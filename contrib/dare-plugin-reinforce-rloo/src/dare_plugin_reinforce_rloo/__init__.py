"""dare-plugin-reinforce-rloo: REINFORCE with the RLOO leave-one-out baseline (arXiv:2402.14740)
on a per-sequence Monte-Carlo masked-token likelihood.

Manifest: only ``@hookimpl`` functions. Names, options and recipe come from
:mod:`dare_plugin_reinforce_rloo.config`; the implementation
(:mod:`dare_plugin_reinforce_rloo.algorithm`, torch) is registered with ``lazy(...)``.
"""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_reinforce_rloo.config import (
    ALGORITHM,
    ESTIMATOR,
    LOSS,
    PAPER,
    RECIPE,
    ReinforceRLOOConfig,
    check_run,
)

__version__ = "0.1.0"


@hookimpl
def dare_register_likelihood_estimators(register):
    register(
        ComponentSpec(
            ESTIMATOR,
            lazy("dare_plugin_reinforce_rloo.algorithm:MaskedMeanSequenceLogProb"),
            "per sequence: mean log p over the masked response tokens of all MC rows",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            LOSS,
            lazy("dare_plugin_reinforce_rloo.algorithm:SequenceReinforceLoss"),
            "per-sequence REINFORCE -(A_b * l_b), mean over sequences",
            reference=PAPER,
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name=ALGORITHM,
            workflow="rl",
            config_cls=ReinforceRLOOConfig,
            build=lazy("dare_plugin_reinforce_rloo.algorithm:build"),
            components={
                "corruption": "random_ratio",
                "trajectory": "final_sequence",
                "estimator": ESTIMATOR,
                "loss": LOSS,
                "advantage": "rloo",
            },
            paper=PAPER,
            description="REINFORCE with the leave-one-out (RLOO) baseline, MC masked-token likelihood",
            recipe=RECIPE,
        )
    )


@hookimpl
def dare_configure(config):
    check_run(config)
