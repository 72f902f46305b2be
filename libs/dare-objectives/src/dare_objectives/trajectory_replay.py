"""Replaying a recorded denoising order as a stack of intermediate states.

A rollout that records ``reveal_step`` (the step at which every response token was committed)
determines every state the sampler visited: before step ``k`` the tokens committed at steps
``< k`` are clean and every other response position holds the mask token. These helpers build
those states as a :class:`~dare_core.interfaces.Corrupted` (row ``m`` = the state before the
``m``-th replayed step, ``masked[m]`` = the tokens committed at that step, the likelihood targets),
so any estimator that reads ``wrapper.token_logprobs(noisy, targets)`` scores the transitions.

For block-diffusion models the order is *block-local*: tokens of different blocks committed at the
same local step of their blocks are one replay row, because in the ``[noisy | clean]`` training
layout a noisy block only sees its own noisy tokens and the clean copies of earlier blocks
(:func:`block_local_steps`).
"""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.api import Corrupted, SequenceBatch, mask_tokens
from dare_nn.block import block_index, positions_from_mask
from dare_objectives import STEP_REPLAY_RECORDS


def replay_states(
    batch: SequenceBatch,
    order: torch.Tensor,
    mask_token_id: int,
    targets: Optional[torch.Tensor] = None,
    steps: Optional[torch.Tensor] = None,
) -> tuple[Corrupted, torch.Tensor]:
    """States before each replayed step.

    :param batch: ``[B, S]`` final sequences (prompt columns ``< P`` stay clean).
    :param order: ``[B, R]`` long step of every response token, ``-1`` = never committed (stays
        masked in every state, never a target).
    :param mask_token_id: the checkpoint's mask id.
    :param targets: ``[B, R]`` bool, which committed tokens are likelihood targets (default: all
        with ``order >= 0``). Non-target tokens still become clean after their step.
    :param steps: the steps to replay (ascending); default: every step that commits a target in
        some row (steps committing nothing are skipped, they carry no transition).
    :returns: ``(corrupted, steps)``; ``corrupted`` has ``M = len(steps)`` rows, ``noisy_ids[m]``
        the state before ``steps[m]``, ``masked[m]`` (``[M, B, S]``, response columns only) the
        tokens committed at ``steps[m]`` that are targets, ``p_mask = 1`` there.
    """
    B, S = batch.input_ids.shape
    P = batch.prompt_len
    if order.shape != (B, S - P):
        raise ValueError(f"order must be [B, R] = {(B, S - P)}, got {tuple(order.shape)}")
    order = order.to(batch.input_ids.device).long()
    committed = order >= 0
    tgt = committed if targets is None else (targets.to(committed.device).bool() & committed)
    if steps is None:
        steps = torch.unique(order[tgt]) if bool(tgt.any()) else order.new_zeros(0)
    steps = steps.to(order.device).long()
    M = int(steps.numel())
    still_masked = (~committed)[None] | (order[None] >= steps[:, None, None])  # [M, B, R]
    hide = torch.zeros(M, B, S, dtype=torch.bool, device=order.device)
    hide[:, :, P:] = still_masked
    noisy = mask_tokens(batch.input_ids, hide, mask_token_id)
    masked = torch.zeros_like(hide)
    masked[:, :, P:] = (order[None] == steps[:, None, None]) & tgt[None]
    return Corrupted(noisy, masked, masked.float()), steps


def response_block_ids(batch: SequenceBatch, block_size: int) -> torch.Tensor:
    """``[B, R]`` block id of every response position on the global block grid (positions counted
    from the first real prompt token, every response position counted as real)."""
    B, S = batch.input_ids.shape
    P = batch.prompt_len
    full = batch.attention_mask.clone()
    full[:, P:] = 1
    pos = positions_from_mask(full, (B, S))
    return block_index(pos, block_size)[:, P:]


def block_local_steps(order: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Dense rank of every token's step among the distinct steps of its own block.

    ``order`` ``[B, R]`` (``-1`` = never committed → ``-1``), ``block_ids`` ``[B, R]``. Within a
    block the local steps are contiguous from 0 and keep the commit order, so the state "tokens
    with local step ``< k`` clean" is exactly the block's state before its ``k``-th commit.
    """
    B, R = order.shape
    valid = order >= 0
    if not bool(valid.any()):
        return torch.full_like(order, -1)
    blk = block_ids - block_ids.min()
    nb = int(blk.max()) + 1
    K = int(order.max()) + 1
    present = torch.zeros(B, nb, K, dtype=torch.long, device=order.device)
    b_idx = torch.arange(B, device=order.device)[:, None].expand(B, R)
    present[b_idx[valid], blk[valid], order[valid]] = 1
    rank = present.cumsum(-1) - 1  # rank[b, blk, s] = number of distinct steps < s in that block
    local = torch.full_like(order, -1)
    local[valid] = rank[b_idx[valid], blk[valid], order[valid]]
    return local


def transition_weights(local: torch.Tensor, block_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Per-sample transition weights ``[steps, B, R]`` (float64).

    A transition is (row ``b``, block, local step ``k``) with token set ``S``; every token of it
    gets ``1 / |S| / T_b`` where ``T_b`` is the number of transitions of row ``b``. So the weights
    of a row sum to 1 and ``Σ_k Σ_j w ℓ_j`` is the mean over the row's transitions of the mean
    token value of each transition.
    """
    B, R = local.shape
    valid = local >= 0
    w = torch.zeros(steps, B, R, dtype=torch.float64, device=local.device)
    if not bool(valid.any()):
        return w
    blk = block_ids - block_ids.min()
    nb = int(blk.max()) + 1
    b_idx = torch.arange(B, device=local.device)[:, None].expand(B, R)
    count = torch.zeros(B, nb, steps, dtype=torch.float64, device=local.device)
    count.index_put_(
        (b_idx[valid], blk[valid], local[valid]),
        torch.ones(int(valid.sum()), dtype=torch.float64, device=local.device),
        accumulate=True,
    )
    n_trans = (count > 0).flatten(1).sum(-1).to(torch.float64)  # [B]
    size = count[b_idx[valid], blk[valid], local[valid]]
    w[local[valid], b_idx[valid], torch.arange(R, device=local.device)[None].expand(B, R)[valid]] = (
        1.0 / size / n_trans[b_idx[valid]]
    )
    return w


class StepReplay:
    r"""Trajectory builder: every recorded denoising step becomes one replayed transition.

    Needs the rollout record ``reveal_step``. The training rows are the rollout rows; the model
    inputs are the states before each step (:func:`replay_states`, drawn from the record, not at
    random), the targets the tokens committed at that step; ``weights`` ``[K, B, R]`` and
    ``extras`` carry what :class:`ReplayClippedLoss` needs.

    * masked-diffusion wrappers (``kind == "masked"``): global steps; weights = the step's
      committed valid response tokens; reduction ``step_mean`` (``(1/K) Σ_k`` token-mean of step
      ``k``, ``K`` = the rollout's number of steps) unless ``reduction`` says otherwise;
    * block-diffusion wrappers (``kind == "block"``): block-local steps
      (:func:`block_local_steps`) replayed for all blocks at once in the ``[noisy | clean]``
      layout, the whole terminal block (the block holding the last valid response token) replayed
      and attended, per-sample transition weights (:func:`transition_weights`), reduction
      ``per_sample``.

    :param reduction: ``auto`` (by wrapper kind as above), ``step_mean``, ``per_sample`` or
        ``token_mean`` (one token-mean over every replayed token of the micro-batch).
    :param left_to_right: require that tokens were committed one per step from left to right
        (``reveal_step[j] = j``); otherwise raise.
    """

    records = STEP_REPLAY_RECORDS
    REDUCTIONS = ("auto", "step_mean", "per_sample", "token_mean")

    def __init__(self, reduction: str = "auto", left_to_right: bool = False):
        if reduction not in self.REDUCTIONS:
            raise ValueError(f"reduction must be one of {self.REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.left_to_right = left_to_right

    def rows(self, wrapper, rollout, context):
        from dare_core.api import DareError, TrainingRows

        if rollout.reveal_step is None:
            raise DareError(
                "this algorithm replays the denoising order but the rollout did not record "
                "reveal_step; choose a rollout backend that lists reveal_step in `dare list rollouts`"
            )
        batch = rollout.sequences()
        P = batch.prompt_len
        reveal = rollout.reveal_step.to(batch.input_ids.device).long()
        valid = batch.response_mask.bool()
        if self.left_to_right:
            pos = torch.arange(reveal.shape[1], device=reveal.device).expand_as(reveal)
            if not bool((reveal == pos)[valid].all()):
                raise DareError(
                    "this algorithm needs left-to-right decoding, one token per step "
                    "(rollout.block_length=1, rollout.steps=rollout.gen_length)"
                )
        block = wrapper.kind == "block"
        reduction = self.reduction if self.reduction != "auto" else ("per_sample" if block else "step_mean")
        if block:
            blk = response_block_ids(batch, int(wrapper.block_size))
            local = block_local_steps(reveal, blk)
            has = valid.any(1)
            last = torch.where(has, valid.long().cumsum(1).argmax(1), torch.zeros_like(has, dtype=torch.long))
            terminal = blk.gather(1, last[:, None])
            replay = (local >= 0) & (blk <= terminal) & has[:, None]
            att = batch.attention_mask.clone()
            att[:, P:] = replay.long()
            batch = SequenceBatch(batch.input_ids, att, P)
            order = torch.where(replay, local, torch.full_like(local, -1))
            K = int(order.max()) + 1 if bool(replay.any()) else 0
            corrupted, _ = replay_states(
                batch, order, wrapper.mask_token_id, steps=torch.arange(K, device=order.device)
            )
            weights = transition_weights(order, blk, K).to(torch.float32)
            num_steps = K
        else:
            corrupted, steps = replay_states(batch, reveal, wrapper.mask_token_id, targets=valid)
            weights = corrupted.masked[:, :, P:].to(torch.float32)
            num_steps = max(int(rollout.num_steps), int(steps.numel()))
        if reduction == "per_sample" and not block:
            # one block: a transition is (row, replayed step); rows of the replay = index in steps
            hit = corrupted.masked[:, :, P:]
            row_of = torch.where(hit.any(0), hit.long().argmax(0), torch.full_like(reveal, -1))
            weights = transition_weights(row_of, torch.zeros_like(row_of), corrupted.num_samples).to(torch.float32)
        B = batch.batch_size
        code = {"step_mean": 0, "per_sample": 1, "token_mean": 2}[reduction]
        extras = {
            "replay_steps": torch.full((B,), num_steps, dtype=torch.long),
            "replay_reduction": torch.full((B,), code, dtype=torch.long),
        }
        return TrainingRows(
            batch, context.advantages, corrupted, weights, extras, {"replay_rows": float(corrupted.num_samples)}
        )
