"""dare-plugin-myalgo: REINFORCE with a group-mean baseline (written by ``dare plugin new algorithm``).

This module is the plugin's *manifest*: it holds only ``@hookimpl`` functions, one per kind of
thing the plugin registers, so a reader sees at a glance what the plugin adds. It stays light:
what registration reads (names, the config class, the recipe) comes from
:mod:`dare_plugin_myalgo.config`, and the implementation (:mod:`dare_plugin_myalgo.algorithm`,
which imports torch) is named with ``lazy("module:attr")``, imported when a run first calls it.

Registered here:

* corruption ``myalgo_mask_response`` (new): mask the whole response, keep the prompt;
* policy loss ``myalgo_pg`` (new): ``-(A · ℓ)`` aggregated over response tokens;
* algorithm ``myalgo``, composing those two with the core's ``response_token_logprob``
  estimator, ``group_norm`` advantage and ``final_sequence`` trajectory builder.
"""

from dare_core.api import AlgorithmSpec, ComponentSpec, hookimpl, lazy
from dare_plugin_myalgo.config import ALGORITHM, CORRUPTION, LOSS, PAPER, RECIPE, MyalgoConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            CORRUPTION,
            lazy("dare_plugin_myalgo.algorithm:MaskWholeResponse"),
            "every valid response token masked, prompt kept (deterministic, one row)",
            kinds=frozenset({"masked"}),
            reference=PAPER,
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            LOSS,
            lazy("dare_plugin_myalgo.algorithm:ReinforceLoss"),
            "REINFORCE -(A * logp), no ratio, no clipping; token-mean",
            reference=PAPER,
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name=ALGORITHM,
            workflow="rl",
            config_cls=MyalgoConfig,
            build=lazy("dare_plugin_myalgo.algorithm:build"),
            kinds=frozenset({"masked"}),
            components={
                "corruption": CORRUPTION,
                "trajectory": "final_sequence",
                "estimator": "response_token_logprob",
                "loss": LOSS,
                "advantage": "group_norm",
            },
            paper=PAPER,
            description="REINFORCE, group-mean baseline, one-step mean-field response log-prob",
            recipe=RECIPE,
        )
    )
