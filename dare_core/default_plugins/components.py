"""Registers the core's generic components, the single-process engine and the core workflows
through the same hooks plugins use."""

from __future__ import annotations

from dare_core.components import (
    ClippedPolicyLoss,
    FinalSequence,
    GroupNormAdvantage,
    MaskedTokenLogProb,
    RandomRatioMasking,
    ResponseTokenLogProb,
    RLOOAdvantage,
)
from dare_core.interfaces import ComponentSpec, EngineSpec, WorkflowSpec
from dare_core.plugins import hookimpl


@hookimpl
def dare_register_corruptions(register):
    register(ComponentSpec(
        "random_ratio", RandomRatioMasking,
        "per-sequence t ~ U(eps, 1); response tokens masked i.i.d. with probability t",
    ))


@hookimpl
def dare_register_trajectory_builders(register):
    register(ComponentSpec("final_sequence", FinalSequence, "train on the final sequence only"))


@hookimpl
def dare_register_likelihood_estimators(register):
    register(ComponentSpec(
        "response_token_logprob", ResponseTokenLogProb,
        "log p(y_j | corrupted x) at every response position, one forward per MC row",
    ))
    register(ComponentSpec(
        "masked_token_logprob", MaskedTokenLogProb,
        "log p(x_i | corrupted x) at corrupted positions (ELBO building block)",
    ))


@hookimpl
def dare_register_policy_losses(register):
    register(ComponentSpec(
        "clipped_pg", ClippedPolicyLoss,
        "PPO clipped surrogate with dual clip, token-mean", reference="arXiv:1707.06347",
    ))


@hookimpl
def dare_register_advantage_estimators(register):
    register(ComponentSpec(
        "group_norm", GroupNormAdvantage, "(r - group mean) / (unbiased group std + eps)",
        reference="arXiv:2402.03300", needs_groups=True,
    ))
    register(ComponentSpec("rloo", RLOOAdvantage, "leave-one-out baseline",
                           reference="arXiv:2402.14740", needs_groups=True))


@hookimpl
def dare_register_engines(register):
    from dare_core.engines.distributed import DDP
    from dare_core.engines.single import build_single

    register(EngineSpec("single", build_single, "one process on one device (CPU or one GPU)"))
    register(DDP)


@hookimpl
def dare_register_workflows(register):
    from dare_core.workflows.rl import run_rl
    from dare_core.workflows.sft import run_sft

    register(WorkflowSpec("rl", run_rl, "rollouts → rewards → advantages → policy update"))
    register(WorkflowSpec("sft", run_sft, "supervised training on reference responses"))
