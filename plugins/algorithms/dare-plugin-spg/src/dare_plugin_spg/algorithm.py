"""SPG (Wang et al. 2025, "SPG: Sandwiched Policy Gradient for Masked Diffusion Language Models",
arXiv:2510.09541).

REINFORCE without ratios on a *bound* of the sequence log-likelihood chosen by the advantage
sign: sequences with a positive advantage push up a lower bound (an ELBO-type masked-token mean),
the others push down an upper bound (a Rényi-type EUBO with exponent β, by default mixed 50/50
with the lower bound), so both directions act on the correct side of log p. The corruption masks
one block of the response (matched to semi-autoregressive decoding) and everything after it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import attrs
import torch

from dare_core.api import Corrupted, RLComponents, SequenceBatch, mask_totals
from dare_objectives.elbo import mc_diagnostics, random_subset, response_valid
from dare_plugin_spg.config import SPGConfig


class BlockWiseMasking:
    r"""SPG corruption, per sequence with ``L_v`` valid response tokens and ``R`` response slots.

    1. Response blocks of ``block_length`` (``n_b = ⌈R/bl⌉``); ``n_v = ⌈L_v/bl⌉`` hold valid tokens.
    2. Row ``i`` takes block ``c_i = π_i mod n_v`` for a random permutation ``π`` of ``0..n_b-1``
       (permutations are concatenated when ``mc_num > n_b``) — the reference's rule, not uniform
       over valid blocks when ``n_b mod n_v ≠ 0``.
    3. ``m = min(bl, L_v − bl·c)``; ``k ~ U{max(⌊m·min_t⌋, 1) .. min(⌊m·max_t⌋, m)}``; a uniformly
       random ``k``-subset of the block is masked with ``p_mask = k/m``; every valid response
       token after the block is masked with ``p_mask = 1``.
    4. Valid tokens before the block (prompt and earlier blocks) are masked i.i.d. with
       probability ``p_mask_prompt`` (``p_mask`` = that probability). Padding is never masked and
       has ``p_mask = 0`` (it is invisible to the model; the reference also masks it).

    Masked tokens get the family's noise (``wrapper.noise``); SPG's bounds require ``absorbing_elbo``.
    """

    def __init__(
        self,
        mc_num: int = 1,
        block_length: int = 32,
        p_mask_prompt: float = 0.15,
        min_t: float = 0.0,
        max_t: float = 1.0,
    ):
        self.mc_num = mc_num
        self.bl = block_length
        self.p = p_mask_prompt
        self.min_t = min_t
        self.max_t = max_t

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        P = batch.prompt_len
        R = S - P
        M = self.mc_num
        valid = batch.attention_mask.bool().cpu()
        resp_valid = response_valid(batch).cpu()
        n_blocks = -(-R // self.bl)
        pos = torch.arange(S)
        block_sel = torch.zeros(M, B, S, dtype=torch.bool)
        counts = torch.zeros(M, B, dtype=torch.long)
        p_block = torch.zeros(M, B)
        after = torch.zeros(M, B, S, dtype=torch.bool)
        before = torch.zeros(M, B, S, dtype=torch.bool)
        for b in range(B):
            Lv = int(resp_valid[b].sum())
            if Lv == 0:
                before[:, b] = valid[b]
                continue
            nv = -(-Lv // self.bl)
            perm = torch.cat([torch.randperm(n_blocks, generator=generator) for _ in range(-(-M // n_blocks))])[:M]
            for i, c in enumerate((perm % nv).tolist()):
                start = P + self.bl * c
                m = min(self.bl, Lv - self.bl * c)
                lo = max(int(math.floor(m * self.min_t)), 1)
                hi = min(int(math.floor(m * self.max_t)), m)
                k = int(torch.randint(lo, max(lo, hi) + 1, (1,), generator=generator))
                block_sel[i, b] = (pos >= start) & (pos < start + m)
                counts[i, b] = k
                p_block[i, b] = k / m
                after[i, b] = (pos >= start + m) & resp_valid[b]
                before[i, b] = (pos < start) & valid[b]
        in_block = random_subset(block_sel, counts, generator)
        iid = (torch.rand(M, B, S, generator=generator) < self.p) & before
        masked = in_block | after | iid
        p_mask = torch.zeros(M, B, S)
        p_mask = torch.where(before, torch.full_like(p_mask, self.p), p_mask)
        p_mask = torch.where(block_sel, p_block[:, :, None].expand(M, B, S), p_mask)
        p_mask = torch.where(after, torch.ones_like(p_mask), p_mask)
        dev = ids.device
        masked = masked.to(dev)
        return Corrupted(
            wrapper.noise(ids.expand(M, B, S), masked, generator),
            masked,
            p_mask.to(dev),
            {"block_mask_count": counts.to(dev)},
        )


def spg_bounds(logp: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor, beta: float):
    r"""SPG's per-sequence bounds from ``M`` rows of response log-probabilities.

    ``logp``: ``[M, B, R]`` log-probabilities of the response tokens; ``targets``: ``[M, B, R]``
    bool, the valid masked response positions ``V_i``; ``lengths``: ``[B]`` valid response tokens.

    .. math::
        E_i = \mathrm{mean}_{j∈V_i} \log p_{ij},\quad ℓ^+ = \mathrm{mean}_i E_i,\quad
        t_i = |V_i|/L_v,\quad q_j = \frac1M\sum_i p_{ij}^β 1[j∈V_i]/t_i,\quad
        ℓ_{EUBO} = \frac1β\,\mathrm{mean}_{j:q_j>0} \log q_j

    Returns ``(elbo [B], eubo [B], rows [M, B])`` with ``rows = E_i``.
    """
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    n = targets.sum(-1)
    rows = torch.where(targets, logp, zero).sum(-1) / n.clamp_min(1)
    elbo = rows.mean(0)
    t = n.to(logp.dtype) / lengths.to(logp.dtype).clamp_min(1)[None]
    # log q_j = logsumexp_i(β log p_ij − log t_i over i with j ∈ V_i) − log M, computed stably
    terms = beta * logp - torch.log(t.clamp_min(1e-12))[:, :, None]
    any_row = targets.any(0)
    terms = torch.where(targets, terms, torch.full_like(terms, -math.inf))
    terms = torch.where(any_row[None], terms, zero)
    log_q = torch.logsumexp(terms, 0) - math.log(logp.shape[0])
    cnt = any_row.sum(-1)
    eubo = torch.where(any_row, log_q, zero).sum(-1) / cnt.clamp_min(1) / beta
    return elbo, eubo, rows


class SPGBounds:
    """SPG estimator: one forward per corruption row, then :func:`spg_bounds`. ``granularity =
    "sequence"``; returns ``[2 + M, B]`` = ``[ℓ⁺ (ELBO), ℓ_EUBO, E_1, …, E_M]`` (the per-row
    values are carried for the Monte-Carlo diagnostics). No length normaliser (masked-token means)."""

    granularity = "sequence"

    def __init__(self, eubo_beta: float = 1.5):
        self.beta = eubo_beta

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None:
            raise ValueError("the SPG estimator needs a corruption")
        P = batch.prompt_len
        resp = batch.response_mask.bool()
        logp = torch.stack(
            [
                wrapper.token_logprobs(
                    corrupted.noisy_ids[m],
                    batch.input_ids,
                    batch.attention_mask,
                    clean_ids=batch.input_ids,
                    prompt_len=P,
                )[:, P:]
                for m in range(corrupted.num_samples)
            ],
            0,
        )
        targets = corrupted.masked[:, :, P:] & resp[None]
        elbo, eubo, rows = spg_bounds(logp, targets, resp.sum(-1), self.beta)
        return torch.cat([elbo[None], eubo[None], rows], 0)


class SPGLoss:
    r"""Sandwiched policy gradient (no ratio, no clipping, no KL; arXiv:2510.09541), normalised by
    the valid response tokens of the whole mini-batch:

    .. math::
        ℓ_b = \begin{cases} ℓ^+_b & \sum_j A_{bj} m_{bj} > 0 \\ ℓ^-_b & \text{otherwise (A = 0 included)} \end{cases},
        \qquad \mathcal L = \frac{\sum_b -\bar A_b\, ℓ_b\, L_b}{\max(1, T_{tokens})},\quad
        T_{tokens} = \sum_{b' ∈ \text{mini-batch}} L_{b'}

    with ``ℓ⁻ = w ℓ_EUBO + (1-w) ℓ⁺`` (``mix``), ``ℓ_EUBO``, ``ℓ⁺`` or ``0``, ``L_b`` the valid
    response length and ``Ā_b`` the sequence advantage; ``b`` runs over this call's rows and
    ``T_tokens`` (``totals["tokens"]``, :func:`~dare_core.api.mask_totals`) over the mini-batch's, so
    the calls of a mini-batch add up to its loss. ``logp``: ``[2 + M, B]`` from :class:`SPGBounds`;
    ``old_logp``/``ref_logp`` are ignored. Metrics: bound means and gap, fraction on the lower
    bound, Monte-Carlo variance of ``E_i``, non-finite counts.
    """

    def __init__(self, logp_estimation: str = "mix", mix_weight: float = 0.5):
        self.mode = logp_estimation
        self.w = mix_weight

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """:func:`~dare_core.api.mask_totals` of ``mask`` ``[B, R]`` (``"tokens"`` = Σ L_b)."""
        return mask_totals(mask)

    def __call__(
        self,
        logp,
        old_logp,
        ref_logp: Optional[torch.Tensor],
        advantages,
        mask,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        elbo, eubo = logp[0], logp[1]
        if self.mode == "mix":
            lower_side = self.w * eubo + (1.0 - self.w) * elbo
        elif self.mode == "eubo":
            lower_side = eubo
        elif self.mode == "elbo":
            lower_side = elbo
        else:
            lower_side = torch.zeros_like(elbo)
        mask = mask.to(elbo.dtype)
        lengths = mask.sum(-1)
        adv = advantages.to(elbo.dtype)
        positive = (adv[:, None] * mask).sum(-1) > 0
        chosen = torch.where(positive, elbo, lower_side)
        total_tokens = (mask_totals(mask) if totals is None else totals)["tokens"]
        loss = (-adv * chosen * lengths).sum() / total_tokens.to(elbo).clamp_min(1.0)
        with torch.no_grad():
            metrics = {
                "spg_elbo_mean": float(elbo.mean()),
                "spg_eubo_mean": float(eubo.mean()),
                "spg_bound_gap": float((eubo - elbo).mean()),
                "spg_lower_bound_frac": float(positive.float().mean()),
                "bound_nonfinite": float((~torch.isfinite(logp[:2])).sum()),
            }
            metrics.update(mc_diagnostics(logp[2:], "elbo"))
        return loss, metrics


def masking_block(cfg: SPGConfig, rollout: Any) -> int:
    """The masking block: the option, else the rollout config's ``block_length``, else 32."""
    if cfg.block_length is not None:
        return cfg.block_length
    fields = attrs.fields_dict(type(rollout)) if attrs.has(type(rollout)) else {}
    return int(rollout.block_length) if "block_length" in fields else 32


def build(cfg: SPGConfig, lookup) -> RLComponents:
    return RLComponents(
        corruption=lookup.corruption(
            mc_num=cfg.mc_num,
            block_length=masking_block(cfg, lookup.rollout),
            p_mask_prompt=cfg.p_mask_prompt,
            min_t=cfg.min_t,
            max_t=cfg.max_t,
        ),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(eubo_beta=cfg.eubo_beta),
        loss=lookup.loss(logp_estimation=cfg.logp_estimation, mix_weight=cfg.mix_weight),
        advantage=lookup.advantage(norm_by_std=cfg.norm_adv_by_std),
    )
