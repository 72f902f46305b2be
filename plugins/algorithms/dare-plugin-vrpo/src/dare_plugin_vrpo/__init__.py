"""dare-plugin-vrpo: VRPO, variance-reduced DPO on masked-diffusion ELBOs (arXiv:2505.19223)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_vrpo.config import RECIPE, VRPOConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "dpo",
            lazy("dare_plugin_vrpo.algorithm:DPOLoss"),
            "DPO on sequence likelihood surrogates of interleaved (chosen, rejected) rows",
            reference="arXiv:2305.18290; arXiv:2505.19223",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="vrpo",
            workflow="preference",
            config_cls=VRPOConfig,
            build=lazy("dare_plugin_vrpo.algorithm:build"),
            kinds=frozenset({"masked"}),
            requires=frozenset({"absorbing_elbo"}),  # DPO on absorbing-state ELBOs
            components={"corruption": "stratified_count_masking", "estimator": "sequence_elbo", "loss": "dpo"},
            paper="arXiv:2505.19223",
            description="VRPO: DPO on stratified, reference-shared Monte-Carlo ELBOs (LLaDA 1.5)",
            recipe=RECIPE,
        )
    )
