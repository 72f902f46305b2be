"""dare-plugin-sft: supervised fine-tuning with the diffusion NELBO (masked and block diffusion) and the
flat cross entropy of uniform-noise diffusion."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_sft.config import RECIPE, SFTConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "nelbo",
            lazy("dare_plugin_sft.objective:NELBOLoss"),
            "masked-diffusion NELBO: sum CE/t over masked tokens / #masked",
            reference="arXiv:2502.09992",
        )
    )
    register(
        ComponentSpec(
            "block_diffusion_nelbo",
            lazy("dare_plugin_sft.block:BlockDiffusionNELBO"),
            "block-diffusion NELBO: sum CE/p over masked tokens / trained response tokens",
            reference="arXiv:2503.09573",
        )
    )
    register(
        ComponentSpec(
            "uniform_diffusion_ce",
            lazy("dare_plugin_sft.uniform:UniformDiffusionCE"),
            "uniform-noise diffusion: mean CE over every valid response token (corrupted or not), no 1/t weight",
            requires=frozenset({"uniform_noise"}),
            reference="arXiv:2107.03006",
        )
    )


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "block_diffusion_masking",
            lazy("dare_plugin_sft.block:BlockDiffusionMasking"),
            "block diffusion: per-sequence p = (1-eps) t + eps, retried until >= 1 response token is masked",
            reference="arXiv:2503.09573",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="sft",
            workflow="sft",
            config_cls=SFTConfig,
            build=lazy("dare_plugin_sft.objective:build"),
            components={
                "corruption": ("random_ratio", "block_diffusion_masking"),
                "estimator": ("masked_token_logprob", "response_token_logprob"),
                "loss": ("nelbo", "block_diffusion_nelbo", "uniform_diffusion_ce"),
            },
            paper="arXiv:2502.09992",
            description="supervised fine-tuning: diffusion NELBO (masked; block models: BD3LM layout; "
            "uniform-noise models: flat CE)",
            recipe=RECIPE,
        )
    )
