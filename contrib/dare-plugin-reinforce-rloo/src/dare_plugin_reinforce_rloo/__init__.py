"""dare-plugin-reinforce-rloo: REINFORCE with the RLOO leave-one-out baseline (arXiv:2402.14740)
on a per-sequence Monte-Carlo masked-token likelihood.

Manifest: only ``@hookimpl`` functions; the implementation is in
:mod:`dare_plugin_reinforce_rloo.algorithm`.
"""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl

from dare_plugin_reinforce_rloo.algorithm import (
    ALGORITHM,
    ESTIMATOR,
    LOSS,
    PAPER,
    RECIPE,
    MaskedMeanSequenceLogProb,
    ReinforceRLOOConfig,
    SequenceReinforceLoss,
    build,
    check_run,
)

__version__ = "0.1.0"


@hookimpl
def dare_register_likelihood_estimators(register):
    register(ComponentSpec(
        ESTIMATOR, MaskedMeanSequenceLogProb,
        "per sequence: mean log p over the masked response tokens of all MC rows",
    ))


@hookimpl
def dare_register_policy_losses(register):
    register(ComponentSpec(
        LOSS, SequenceReinforceLoss, "per-sequence REINFORCE -(A_b * l_b), mean over sequences",
        reference=PAPER,
    ))


@hookimpl
def dare_register_algorithms(register):
    register(AlgorithmSpec(
        name=ALGORITHM,
        workflow="rl",
        config_cls=ReinforceRLOOConfig,
        build=build,
        components={"corruption": "random_ratio", "trajectory": "final_sequence",
                    "estimator": ESTIMATOR, "loss": LOSS, "advantage": "rloo"},
        paper=PAPER,
        description="REINFORCE with the leave-one-out (RLOO) baseline, MC masked-token likelihood",
        recipe=RECIPE,
    ))


@hookimpl
def dare_configure(config):
    check_run(config)
