"""Registers the core's generic components, the single-process and ddp engines and the core
workflows through the same hooks plugins use; every callable is :class:`~dare_core.plugins.lazy`,
so registering imports no torch."""

from __future__ import annotations

from dare_core.interfaces import ComponentSpec, EngineSpec, RLComponents, SFTComponents, WorkflowSpec
from dare_core.plugins import hookimpl, lazy

C = "dare_core.components."


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "random_ratio",
            lazy(C + "corruptions:RandomRatioMasking"),
            "per-sequence t ~ U(eps, 1); response tokens masked i.i.d. with probability t",
        )
    )


@hookimpl
def dare_register_trajectory_builders(register):
    register(
        ComponentSpec("final_sequence", lazy(C + "trajectories:FinalSequence"), "train on the final sequence only")
    )


@hookimpl
def dare_register_likelihood_estimators(register):
    register(
        ComponentSpec(
            "response_token_logprob",
            lazy(C + "estimators:ResponseTokenLogProb"),
            "log p(y_j | corrupted x) at every response position, one forward per MC row",
        )
    )
    register(
        ComponentSpec(
            "masked_token_logprob",
            lazy(C + "estimators:MaskedTokenLogProb"),
            "log p(x_i | corrupted x) at corrupted positions (ELBO building block)",
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "clipped_pg",
            lazy(C + "losses:ClippedPolicyLoss"),
            "PPO clipped surrogate with dual clip, token-mean",
            reference="arXiv:1707.06347",
        )
    )


@hookimpl
def dare_register_advantage_estimators(register):
    register(
        ComponentSpec(
            "group_norm",
            lazy(C + "advantages:GroupNormAdvantage"),
            "(r - group mean) / (unbiased group std + eps)",
            reference="arXiv:2402.03300",
            needs_groups=True,
        )
    )
    register(
        ComponentSpec(
            "rloo",
            lazy(C + "advantages:RLOOAdvantage"),
            "leave-one-out baseline",
            reference="arXiv:2402.14740",
            needs_groups=True,
        )
    )


@hookimpl
def dare_register_engines(register):
    register(
        EngineSpec(
            "single", lazy("dare_core.engines.single:build_single"), "one process on one device (CPU or one GPU)"
        )
    )
    register(
        EngineSpec(
            "ddp",
            lazy("dare_core.engines.distributed:build_ddp"),
            "one process per device, full replicas, gradients averaged over ranks",
            distributed=True,
        )
    )


@hookimpl
def dare_register_workflows(register):
    register(
        WorkflowSpec(
            "rl",
            lazy("dare_core.workflows.rl:run_rl"),
            "rollouts → rewards → advantages → policy update",
            components=RLComponents,
        )
    )
    register(
        WorkflowSpec(
            "sft",
            lazy("dare_core.workflows.sft:run_sft"),
            "supervised training on reference responses",
            components=SFTComponents,
        )
    )
