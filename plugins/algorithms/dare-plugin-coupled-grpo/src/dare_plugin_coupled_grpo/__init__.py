"""dare-plugin-coupled-grpo: Coupled-GRPO from DiffuCoder (arXiv:2506.20639)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_coupled_grpo.config import RECIPE, CoupledConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "coupled_masking",
            lazy("dare_plugin_coupled_grpo.algorithm:CoupledMasking"),
            "three rows: whole response masked, a ratio-t mask and its complement (p_mask 1 / t / 1-t)",
            reference="arXiv:2506.20639",
        )
    )


@hookimpl
def dare_register_likelihood_estimators(register):
    register(
        ComponentSpec(
            "coupled_token_logprob",
            lazy("dare_plugin_coupled_grpo.algorithm:CoupledTokenLogProb"),
            "(l_full + l_t/t + l_complement/(1-t)) / 2 per response token from the three coupled rows",
            reference="arXiv:2506.20639",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="coupled_grpo",
            workflow="rl",
            config_cls=CoupledConfig,
            build=lazy("dare_plugin_coupled_grpo.algorithm:build"),
            components={
                "corruption": "coupled_masking",
                "trajectory": "final_sequence",
                "estimator": "coupled_token_logprob",
                "loss": "clipped_pg",
                "advantage": "group_norm",
            },
            paper="arXiv:2506.20639",
            description="GRPO scoring every token under a complementary mask pair plus the full mask",
            recipe=RECIPE,
        )
    )
