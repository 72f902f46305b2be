"""BGPO (Lin et al. 2025, "Boundary-Guided Policy Optimization for Memory-efficient RL of
Diffusion Large Language Models", arXiv:2510.11683).

The sequence log-likelihood is approximated by a Monte-Carlo ELBO with many corruption rows. For
positive advantages the PPO ratio of each row is *linear* in the row's ELBO (``ρ = 1 + Δ``, the
first-order lower bound of ``e^Δ``), so the objective is a sum over rows and its gradient can be
accumulated one row at a time: memory does not grow with ``mc_num``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from dare_core.api import RLComponents, agg_loss, kl_penalty, mask_totals, masked_mean
from dare_objectives.elbo import (
    clipped_surrogate,
    mc_diagnostics,
    per_row_backward,
    ratio_diagnostics,
)
from dare_plugin_bgpo.config import BGPOConfig


def bgpo_surrogate(
    new: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    c: float = 3.0,
    nan_guard: bool = True,
    agg: str = "token-mean",
    totals: Optional[dict] = None,
):
    r"""BGPO clipped objective on same-shaped tensors (per token or per row broadcast).

    .. math::
        ρ = \begin{cases} 1 + (ℓ - ℓ_{old}) & A > 0 \\ e^{ℓ - ℓ_{old}} & A \le 0 \end{cases}

    then the dual-clipped PPO surrogate of ``ρ`` (ε_low, ε_high, ``c`` for ``A < 0``),
    aggregated with ``agg`` over the mini-batch ``totals`` (:func:`~dare_core.api.agg_loss`). With ``nan_guard=False`` the ``A > 0`` branch is evaluated as
    ``exp(log(1 + Δ))`` like the reference (NaN for ``Δ <= −1``).

    Returns ``(loss, metrics, ratio)``; metrics: ``pg_clipfrac``, ``pg_clipfrac_lower``,
    ``ppo_kl`` (masked mean of ``−log ρ`` over ``ρ > 0``), ``ratio_nonpositive`` (count of
    weighted entries with ``A > 0`` and ``1 + Δ <= 0``).
    """
    delta = new - old
    pos = adv > 0
    lin = 1.0 + delta if nan_guard else torch.exp(torch.log1p(delta))
    ratio = torch.where(pos, lin, torch.exp(delta))
    loss_tok, clipped, dual = clipped_surrogate(ratio, adv, eps_low, eps_high, c)
    loss = agg_loss(loss_tok, mask, agg, totals)
    with torch.no_grad():
        m = mask.to(loss_tok.dtype)
        bad = pos & (1.0 + delta <= 0) & (m > 0)
        ok = (ratio > 0) & torch.isfinite(ratio)
        neg_log = torch.where(ok, -torch.log(torch.where(ok, ratio, torch.ones_like(ratio))), torch.zeros_like(ratio))
        metrics = {
            "pg_clipfrac": float(masked_mean(clipped.to(m.dtype), m)),
            "pg_clipfrac_lower": float(masked_mean(dual.to(m.dtype), m)),
            "ppo_kl": float(masked_mean(neg_log, m * ok)),
            "ratio_nonpositive": float(bad.sum()),
        }
    return loss, metrics, ratio


class BGPOLoss:
    r"""BGPO loss over Monte-Carlo rows: ``(1/M) Σ_m bgpo_surrogate(l_m, l^{old}_m, A)`` where
    ``l_m`` is row ``m``'s normalised ELBO broadcast over the response, plus (``kl_coef > 0``)
    ``β (1/M) Σ_m agg(KL(l_m, mean_m l^{ref}_m, A))`` with the dLLM KL rule of
    :func:`~dare_core.components.losses.kl_penalty` (one row against the reference's row mean, as
    the reference does; off in every recipe). ``logp``/``old_logp``/``ref_logp``: ``[M, B]``;
    ``advantages``: ``[B]``; ``mask``: ``[B, R]``; ``totals``: :func:`~dare_core.api.mask_totals`
    of the mini-batch. ``accumulate`` computes the same gradient with a backward per row
    (constant memory in ``M``)."""

    def __init__(
        self,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        clip_ratio_c: float = 3.0,
        nan_guard: bool = True,
        agg: str = "token-mean",
        kl_coef: float = 0.0,
        kl_type: str = "k3",
    ):
        self.kw = dict(eps_low=clip_ratio_low, eps_high=clip_ratio_high, c=clip_ratio_c, nan_guard=nan_guard, agg=agg)
        self.kl_coef = kl_coef
        self.kl_type = kl_type

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        return mask_totals(mask)

    def row(
        self,
        l_row: torch.Tensor,
        old_row: torch.Tensor,
        ref_mean: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        totals: dict,
    ):
        shape = mask.shape
        new = l_row[:, None].expand(shape)
        old = old_row[:, None].to(new.dtype).expand(shape)
        adv = advantages.to(new.dtype)[:, None].expand(shape)
        loss, metrics, ratio = bgpo_surrogate(new, old, adv, mask, totals=totals, **self.kw)
        metrics.update(ratio_diagnostics(ratio[:, 0], (mask.sum(-1) > 0).float()))
        if self.kl_coef > 0:
            if ref_mean is None:
                raise ValueError("kl_coef > 0 needs reference ELBOs")
            kl = agg_loss(
                kl_penalty(new, ref_mean[:, None].to(new.dtype).expand(shape), adv, self.kl_type),
                mask,
                self.kw["agg"],
                totals,
            )
            loss = loss + self.kl_coef * kl
            metrics["kl_loss"] = float(kl.detach())
        return loss, metrics

    def __call__(
        self,
        logp,
        old_logp,
        ref_logp: Optional[torch.Tensor],
        advantages,
        mask,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict] = None,
    ):
        totals = self.totals(mask, extras) if totals is None else totals
        M = logp.shape[0]
        ref_mean = ref_logp.mean(0) if ref_logp is not None else None
        total, agg = 0.0, {}
        for m in range(M):
            loss, metrics = self.row(logp[m], old_logp[m], ref_mean, advantages, mask, totals)
            total = total + loss / M
            for k, v in metrics.items():
                agg[k] = agg.get(k, 0.0) + v / M
        agg.update(mc_diagnostics(logp, "elbo"))
        return total, agg

    #: ``accumulate`` takes ``old_logp=None`` (policy unchanged since the rollout): each row's own
    #: detached ELBO is then its old value (ratio 1)
    computes_own_old = True

    def accumulate(
        self,
        estimate,
        num_rows,
        old_logp,
        ref_logp,
        advantages,
        mask,
        scale,
        *,
        extras: Optional[dict] = None,
        backward: Callable = torch.Tensor.backward,
        totals: Optional[dict] = None,
    ):
        totals = self.totals(mask, extras) if totals is None else totals
        ref_mean = ref_logp.mean(0) if ref_logp is not None else None
        seen = []

        def row_loss(e, m):
            seen.append(e.detach())
            old = e.detach() if old_logp is None else old_logp[m]
            return self.row(e, old, ref_mean, advantages, mask, totals)

        loss, metrics = per_row_backward(estimate, num_rows, row_loss, scale, backward)
        metrics.update(mc_diagnostics(torch.stack(seen, 0), "elbo"))
        return loss, metrics


def build(cfg: BGPOConfig, lookup) -> RLComponents:
    loss = lookup.loss(
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        clip_ratio_c=cfg.clip_ratio_c,
        nan_guard=cfg.nan_guard,
        agg=cfg.loss_agg_mode,
        kl_coef=cfg.kl_coef,
        kl_type=cfg.kl_type,
    )
    return RLComponents(
        corruption=lookup.corruption(mc_num=cfg.mc_num, n_l=cfg.n_l),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(norm=cfg.length_norm),
        loss=loss,
        accumulate=loss if cfg.accumulate else None,
        advantage=lookup.advantage(norm_by_std=cfg.norm_adv_by_std),
        needs_ref=cfg.kl_coef > 0,
    )
