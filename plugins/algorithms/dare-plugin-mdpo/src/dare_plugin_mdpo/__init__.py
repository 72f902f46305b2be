"""dare-plugin-mdpo: MDPO, Masked Diffusion Policy Optimization (arXiv:2508.13148)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, RolloutNeeds, hookimpl, lazy
from dare_plugin_mdpo.config import RECIPE, RECORDS, MDPOConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_trajectory_builders(register):
    register(
        ComponentSpec(
            "intermediate_states",
            lazy("dare_plugin_mdpo.algorithm:StepStateRows"),
            "reward every step's predicted clean response, step-wise advantages, one training row "
            "per (rollout, selected step): state -> predicted tokens",
            requires=frozenset({"mask_token"}),
            reference="arXiv:2508.13148",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "mdpo_loss",
            lazy("dare_plugin_mdpo.algorithm:MDPOLoss"),
            "clipped ratio x R/#masked, confidence-weighted over masked positions (no dual clip)",
            requires=frozenset({"absorbing_elbo"}),
            reference="arXiv:2508.13148",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="mdpo",
            workflow="rl",
            config_cls=MDPOConfig,
            build=lazy("dare_plugin_mdpo.algorithm:build"),
            kinds=frozenset({"masked"}),
            # MASK states of the sampler; the R/#masked weight is the absorbing ELBO's 1/t
            requires=frozenset({"mask_token", "absorbing_elbo"}),
            components={
                "trajectory": "intermediate_states",
                "estimator": "response_token_logprob",
                "loss": "mdpo_loss",
                "advantage": "group_norm",
            },
            paper="arXiv:2508.13148",
            description="rewards intermediate predictions of every denoising step; trains the "
            "denoiser on the visited states with step-wise advantages",
            rollout=RolloutNeeds(records=RECORDS),
            recipe=RECIPE,
        )
    )
