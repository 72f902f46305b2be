"""dare-plugin-spg: Sandwiched Policy Gradient (arXiv:2510.09541)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_spg.config import RECIPE, SPGConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "spg_block_masking",
            lazy("dare_plugin_spg.algorithm:BlockWiseMasking"),
            "one random response block partly masked, later blocks fully, earlier tokens at rate p",
            kinds=frozenset({"masked"}),
            reference="arXiv:2510.09541",
        )
    )


@hookimpl
def dare_register_likelihood_estimators(register):
    register(
        ComponentSpec(
            "spg_bounds",
            lazy("dare_plugin_spg.algorithm:SPGBounds"),
            "masked-token-mean ELBO and Rényi EUBO per sequence",
            requires=frozenset({"absorbing_elbo"}),
            reference="arXiv:2510.09541",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "spg",
            lazy("dare_plugin_spg.algorithm:SPGLoss"),
            "REINFORCE on the ELBO (A > 0) or the EUBO/mix (A <= 0), length-weighted",
            reference="arXiv:2510.09541",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="spg",
            workflow="rl",
            config_cls=SPGConfig,
            build=lazy("dare_plugin_spg.algorithm:build"),
            kinds=frozenset({"masked"}),
            requires=frozenset({"absorbing_elbo"}),  # lower and upper bounds of the absorbing-state likelihood
            components={
                "corruption": "spg_block_masking",
                "estimator": "spg_bounds",
                "loss": "spg",
                "advantage": "group_norm",
                "trajectory": "final_sequence",
            },
            paper="arXiv:2510.09541",
            description="SPG: policy gradient on a lower (A > 0) or upper (A <= 0) likelihood bound",
            recipe=RECIPE,
        )
    )
