"""EBPO (ELBO-based Block-level Policy Optimization; LLaDA2.1 technical report, arXiv:2602.08676,
Eq. 4–5).

For block-diffusion models the sequence log-likelihood is approximated by a *composite* ELBO: the
sum over every response block of its block-conditional ELBO term, averaged over Monte-Carlo rows
(each row masks some tokens in **every** block at a cyclically stratified noise level). PPO
clipping is applied once, to the sequence-level ratio of composite ELBOs, in log space.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from dare_core.api import Corrupted, DareError, RLComponents, SequenceBatch
from dare_nn.block import block_index, positions_from_mask
from dare_objectives.elbo import (
    RowMeanObjective,
    cyclic_levels,
    mc_diagnostics,
    ratio_diagnostics,
    response_valid,
    sequence_kl,
)
from dare_plugin_ebpo.config import EBPOConfig


def block_mask_counts(levels: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Tokens masked in a block of ``n`` tokens at noise level ``τ``: ``min(⌊τ n⌋ + 1, n)``
    (at least one, at most all). ``levels`` broadcasts against ``sizes``."""
    return torch.minimum(torch.floor(levels * sizes).long() + 1, sizes.long())


class BlockELBOMasking:
    r"""Block-aware corruption for the composite ELBO, per sequence.

    Response blocks are taken in compact coordinates with the global origin: the block of a
    valid response token is ``⌊(position among the row's valid tokens) / block_length⌋``, so the
    first response block may share its block with the prompt's tail and the first/last blocks
    may be partial. For each group of ``n_l`` rows and the ``N = n_l · n_blocks`` (row, block)
    cells, ``τ_c = (u + c/N) mod 1`` with one ``u ~ U(0,1)`` per group (cell ``c = row·n_blocks
    + block``). A block of ``n`` tokens gets ``k = min(⌊τ n⌋ + 1, n)`` uniformly chosen tokens
    masked with ``p_mask = k/n``; every block has a masked token in every row; the prompt is never
    masked; masked tokens get the family's noise (``wrapper.noise``; EBPO itself requires
    ``absorbing_elbo``). ``extras["levels"]`` is ``[M, B, S]`` (τ of each position's cell, 0 elsewhere).
    The model wrapper builds the block layout (``[noisy | clean]`` for block kinds).
    """

    def __init__(self, mc_num: int = 16, n_l: int = 16, block_length: int = 0):
        if mc_num < 1 or n_l < 1 or mc_num % n_l:
            raise ValueError(f"n_l={n_l} must divide mc_num={mc_num}")
        self.mc_num = mc_num
        self.n_l = n_l
        self.block_length = block_length

    def block_size(self, wrapper) -> int:
        bl = self.block_length or getattr(wrapper, "block_size", None)
        if not bl:
            raise DareError(
                "the block ELBO corruption needs a block size; the model has none, so set "
                "algorithm.block_length (or use a block-diffusion model)"
            )
        return int(bl)

    def response_blocks(self, batch: SequenceBatch, block_size: int) -> torch.Tensor:
        """``[B, S]`` block id (compact, global origin) of each valid response token, -1 elsewhere."""
        att = batch.attention_mask
        pos = positions_from_mask(att, tuple(att.shape), att.device)
        ids = block_index(pos, block_size)
        return torch.where(response_valid(batch), ids, torch.full_like(ids, -1))

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        M = self.mc_num
        blocks = self.response_blocks(batch, self.block_size(wrapper)).cpu()
        masked = torch.zeros(M, B, S, dtype=torch.bool)
        p_mask = torch.zeros(M, B, S, dtype=torch.float32)
        levels = torch.zeros(M, B, S, dtype=torch.float32)
        for b in range(B):
            uniq = blocks[b][blocks[b] >= 0].unique(sorted=True)
            nb = len(uniq)
            if nb == 0:
                continue
            members = [torch.nonzero(blocks[b] == u).flatten() for u in uniq.tolist()]
            sizes = torch.tensor([len(x) for x in members])
            for g in range(M // self.n_l):
                u = float(torch.rand((), generator=generator, dtype=torch.float64))
                tau = cyclic_levels(u, self.n_l * nb).reshape(self.n_l, nb)
                k = block_mask_counts(tau, sizes[None])
                for r in range(self.n_l):
                    i = g * self.n_l + r
                    for j, pos in enumerate(members):
                        n = len(pos)
                        pick = pos[torch.randperm(n, generator=generator)[: int(k[r, j])]]
                        masked[i, b, pick] = True
                        p_mask[i, b, pick] = float(k[r, j]) / n
                        levels[i, b, pos] = float(tau[r, j])
        dev = ids.device
        masked = masked.to(dev)
        return Corrupted(
            wrapper.noise(ids.expand(M, B, S), masked, generator), masked, p_mask.to(dev), {"levels": levels.to(dev)}
        )


def _check_sequence_inputs(elbo, old_elbo, advantages, rows) -> None:
    """One-line refusal of inputs that are not one value per sequence ``[B]``."""
    shapes = [tuple(t.shape) for t in (elbo, old_elbo, advantages, rows)]
    if elbo.dim() != 1 or len(set(shapes)) != 1:
        raise DareError(
            f"EBPO's sequence loss takes one composite ELBO, old ELBO, advantage and "
            f"valid flag per sequence (all [B]); got shapes {shapes}"
        )


def ebpo_sequence_loss(
    elbo: torch.Tensor,
    old_elbo: torch.Tensor,
    advantages: torch.Tensor,
    rows: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    num_rows: Optional[torch.Tensor] = None,
):
    r"""Sequence-level clipped objective in log space over the valid sequences ``rows`` (bool ``[B]``):

    .. math::
        δ = Ê − Ê_{old},\quad δ' = \begin{cases} \min(δ, \log(1+ε_{high})) & A \ge 0 \\
        \max(δ, \log(1−ε_{low})) & A < 0 \end{cases},\quad
        \mathcal L = \frac1N \sum_{b\ \mathrm{valid}} −A_b e^{δ'_b}

    with ``N = num_rows``, the valid sequences of the whole mini-batch (``None``: of these rows).
    No dual clip: unbounded for ``A < 0`` and large ``δ``. Sequences outside ``rows`` are dropped
    before any arithmetic, so a NaN or infinite ELBO there reaches neither the loss nor the
    gradient; half-precision inputs are computed in float32 (as the reference). ``elbo``,
    ``old_elbo``, ``advantages``: ``[B]``. Metrics, over this call's valid rows: ``pg_clipfrac``
    (``δ`` clipped), ``pg_clipfrac_lower`` (clipped with ``A < 0``), ``ppo_kl`` (mean ``−δ``).
    """
    _check_sequence_inputs(elbo, old_elbo, advantages, rows)
    rows = rows.bool()
    n = rows.sum() if num_rows is None else num_rows
    if not float(n) > 0:
        raise DareError(
            "EBPO needs at least one sequence with a response token in the mini-batch; "
            "check the rollout's response mask (every response here is empty)"
        )
    work = torch.float32 if elbo.dtype in (torch.float16, torch.bfloat16) else elbo.dtype
    delta = elbo[rows].to(work) - old_elbo[rows].to(work)
    adv = advantages[rows].to(work)
    low, high = math.log1p(-eps_low), math.log1p(eps_high)
    clipped = torch.where(adv >= 0, delta.clamp(max=high), delta.clamp(min=low))
    loss = (-adv * torch.exp(clipped)).sum() / n.to(work)
    with torch.no_grad():
        k = max(1, int(rows.sum()))
        lower = (delta < low) & (adv < 0)
        metrics = {
            "pg_clipfrac": float((lower | ((delta > high) & (adv > 0))).sum()) / k,
            "pg_clipfrac_lower": float(lower.sum()) / k,
            "ppo_kl": float(-delta.sum()) / k,
        }
        metrics.update(ratio_diagnostics(torch.exp(delta)))
    return loss, metrics


class EBPOLoss(RowMeanObjective):
    r"""EBPO on composite ELBO rows ``[M, B]``: :func:`ebpo_sequence_loss` of ``Ê = mean_m e_m``
    over sequences with a valid response, plus ``β · Σ_{b valid} KL(Ê_b, Ê^{ref}_b) / N`` when
    ``kl_coef > 0``; ``N = totals["rows"]``, the valid sequences of the whole mini-batch (summed
    over micro-batches and ranks), so the gradient does not depend on the micro-batch size or the
    world size. The workflow's ``accumulate`` path uses the exact proxy gradient (one row's graph
    at a time)."""

    def __init__(
        self, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, kl_coef: float = 0.0, kl_type: str = "k3"
    ):
        self.eps_low = clip_ratio_low
        self.eps_high = clip_ratio_high
        self.kl_coef = kl_coef
        self.kl_type = kl_type

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """``{"rows": sequences with a response token}`` of ``mask`` ``[B, R]`` (float64 scalar)."""
        return {"rows": (mask.sum(-1) > 0).sum().to(torch.float64)}

    def objective(self, elbo, rows, old_rows, ref_rows, advantages, mask, *, totals):
        valid = mask.sum(-1) > 0
        n = totals["rows"]
        loss, metrics = ebpo_sequence_loss(
            elbo, old_rows.mean(0), advantages, valid, self.eps_low, self.eps_high, num_rows=n
        )
        if self.kl_coef > 0:
            if ref_rows is None:
                raise DareError("EBPO with kl_coef > 0 needs reference ELBOs; the loop passed none")
            ref = ref_rows.mean(0)[valid].to(loss.dtype)
            kl = sequence_kl(elbo[valid].to(loss.dtype), ref, self.kl_type).sum() / n.to(loss.dtype)
            loss = loss + self.kl_coef * kl
            metrics["kl_loss"] = float(kl.detach())
        metrics.update(mc_diagnostics(rows, "elbo"))
        return loss, metrics


def build(cfg: EBPOConfig, lookup) -> RLComponents:
    loss = lookup.loss(
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        kl_coef=cfg.kl_coef,
        kl_type=cfg.kl_type,
    )
    return RLComponents(
        corruption=lookup.corruption(mc_num=cfg.mc_num, n_l=cfg.n_l, block_length=cfg.block_length),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(norm="none"),
        loss=loss,
        accumulate=loss,
        advantage=lookup.advantage(norm_by_std=cfg.norm_adv_by_std),
        needs_ref=cfg.kl_coef > 0,
    )
