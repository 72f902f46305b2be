"""dare-plugin-espo: sequence-level ELBO policy optimization (arXiv:2512.03759)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_espo.config import RECIPE, ESPOConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "complement_masking",
            lazy("dare_plugin_espo.algorithm:ComplementMasking"),
            "mask counts stratified across the batch, each mask set paired with its complement",
            reference="arXiv:2512.03759",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "espo",
            lazy("dare_plugin_espo.algorithm:ESPOLoss"),
            "sequence-level PPO on the length-normalised ELBO, KL on raw ELBOs / R",
            reference="arXiv:2512.03759",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="espo",
            workflow="rl",
            config_cls=ESPOConfig,
            build=lazy("dare_plugin_espo.algorithm:build"),
            kinds=frozenset({"masked", "block"}),
            requires=frozenset({"absorbing_elbo"}),  # its sequence likelihood is the absorbing-state ELBO
            components={
                "corruption": "complement_masking",
                "estimator": "sequence_elbo",
                "loss": "espo",
                "advantage": "rloo",
                "trajectory": "final_sequence",
            },
            paper="arXiv:2512.03759",
            description="ESPO: sequence-level PPO on a variance-reduced ELBO with RLOO advantages",
            recipe=RECIPE,
        )
    )
