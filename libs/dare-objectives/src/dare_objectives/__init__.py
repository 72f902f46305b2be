"""Objectives shared by several algorithms: stratified count masking (arXiv:2505.19223), the
sequence ELBO estimator, step replay of a recorded denoising trajectory and its clipped loss, and
the Monte-Carlo ELBO of a continuation given a context that evaluation scores choices with
(``dare_objectives.likelihood``).
Algorithms declare them by name (``AlgorithmSpec.components``) and build them through
``ComponentLookup``; their building blocks are imported
from the sibling modules. Registering imports none of them (``lazy``). ``sequence_elbo`` requires
the ``absorbing_elbo`` capability, ``step_replay`` (which rebuilds visited states with MASK tokens)
``mask_token``; the corruption noises with the family's kernel (``wrapper.noise``)."""

from __future__ import annotations

from dare_core.api import ComponentSpec, hookimpl, lazy

#: what the ``step_replay`` trajectory builder needs the rollout to record (``StepReplay.records``)
STEP_REPLAY_RECORDS = frozenset({"reveal_step"})


@hookimpl
def dare_register_corruptions(register):
    register(
        ComponentSpec(
            "stratified_count_masking",
            lazy("dare_objectives.elbo:StratifiedCountMasking"),
            "exact mask counts stratified over 1..L per group of rows (stratified timesteps); p_mask = count / L",
            reference="arXiv:2505.19223",
        )
    )


@hookimpl
def dare_register_trajectory_builders(register):
    register(
        ComponentSpec(
            "step_replay",
            lazy("dare_objectives.trajectory_replay:StepReplay"),
            "replay every recorded denoising step (reveal_step): states before the step, its tokens "
            "as targets; block models replay block-local steps of all blocks at once",
            requires=frozenset({"mask_token"}),
        )
    )


@hookimpl
def dare_register_likelihood_estimators(register):
    register(
        ComponentSpec(
            "sequence_elbo",
            lazy("dare_objectives.elbo:SequenceELBO"),
            "per-row ELBO of the response, sum of log p / p_mask over corrupted tokens, [M, B]",
            requires=frozenset({"absorbing_elbo"}),
        )
    )


@hookimpl
def dare_register_policy_losses(register):
    register(
        ComponentSpec(
            "replay_clipped_pg",
            lazy("dare_objectives.replay_loss:make_replay_clipped_loss"),
            "clipped surrogate over replayed steps (step-mean / per-sample / token-mean), one "
            "forward+backward per chunk of steps",
        )
    )
