"""dare-plugin-dtreerpo: d-TreeRPO, tree-structured RL over the denoising process
(arXiv:2512.09675)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, RolloutNeeds, hookimpl, lazy
from dare_plugin_dtreerpo.config import RECIPE, RESUMABLE, DTreeConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_trajectory_builders(register):
    register(
        ComponentSpec(
            "tree_transitions",
            lazy("dare_plugin_dtreerpo.algorithm:TreeTransitions"),
            "one training row per tree edge (parent state -> child state) with the sibling-relative "
            "advantage of the child's value (mean leaf reward below it)",
            requires=frozenset({"mask_token"}),
            reference="arXiv:2512.09675",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "tree_loss",
            lazy("dare_plugin_dtreerpo.algorithm:TreeLoss"),
            "per-transition clipped objective (no dual clip) + k3 KL to the reference + "
            "time-scheduled self-distillation towards positively rated siblings",
            reference="arXiv:2512.09675",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="dtreerpo",
            workflow="rl",
            config_cls=DTreeConfig,
            build=lazy("dare_plugin_dtreerpo.algorithm:build"),
            kinds=frozenset({"masked", "block"}),
            requires=frozenset({"mask_token"}),  # the tree starts from an all-MASK response
            components={"trajectory": "tree_transitions", "estimator": "response_token_logprob", "loss": "tree_loss"},
            paper="arXiv:2512.09675",
            description="branching rollouts over the denoising steps; each parent->child transition "
            "trained with a sibling-relative advantage, plus self-distillation",
            rollout=RolloutNeeds(
                fields=frozenset({"steps", "gen_length"}),
                methods=RESUMABLE,
                wrap=lazy("dare_plugin_dtreerpo.algorithm:tree_rollout"),
            ),
            recipe=RECIPE,
        )
    )
