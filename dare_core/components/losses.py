"""Generic losses and aggregation helpers. Shapes: ``B`` sequences, ``R`` response length, ``M``
Monte-Carlo corruption samples."""

from __future__ import annotations

from typing import Literal, Optional, cast

import torch

from dare_core.errors import DareError

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(x * m) / (sum(m) + 1e-8)``; ``mask`` may hold fractional weights."""
    return (x * mask).sum() / (mask.sum() + 1e-8)


def mask_totals(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The statistics :func:`agg_loss` divides by, of ``mask`` ``[B, R]`` (float weights allowed):
    ``{"tokens": Σ mask, "rows": B, "cells": B·R}``, float64 scalars on ``mask``'s device."""
    return {
        "tokens": mask.to(torch.float64).sum(),
        "rows": torch.tensor(float(mask.shape[-2]), dtype=torch.float64, device=mask.device),
        "cells": torch.tensor(float(mask.numel()), dtype=torch.float64, device=mask.device),
    }


def sum_totals(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Key-wise sum of several rows' totals (same keys, same shapes)."""
    # a sum of tensors (``parts`` is not empty) is a tensor, not sum()'s int start
    return {k: cast(torch.Tensor, sum(p[k].to(parts[0][k].device) for p in parts)) for k in parts[0]}


def agg_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    totals: Optional[dict[str, torch.Tensor]] = None,
) -> torch.Tensor:
    """Reduce a ``[B, R]`` token loss ``ℓ`` of some rows to their share of the mini-batch loss.

    With ``m = mask`` and ``T = totals`` (the mini-batch's :func:`mask_totals`, summed over its
    micro-batches and ranks; ``None``: these rows' own):

    * ``token-mean``: ``Σ_{b,t} m ℓ / T["tokens"]`` (DAPO's token mean, arXiv:2503.14476);
    * ``seq-mean-token-sum``: ``Σ_b Σ_t m ℓ / T["rows"]``;
    * ``seq-mean-token-mean``: ``Σ_b (Σ_t m ℓ / Σ_t m) / T["rows"]`` (a row without tokens:
      ``DareError``, its token mean is 0/0);
    * ``seq-mean-token-sum-norm``: ``Σ_{b,t} m ℓ / T["cells"]``, ``cells = B·R`` (the constant
      normaliser ``1/G Σ_i Σ_t ℓ / L_max`` of arXiv:2503.20783).

    Summed over the micro-batches and ranks of the mini-batch the shares are the mini-batch's
    loss, so the gradient does not depend on the micro-batch size or the world size.
    """
    mask = mask.to(loss.dtype)
    t = mask_totals(mask) if totals is None else totals
    den = lambda key: t[key].to(loss.dtype).clamp_min(1e-8)  # noqa: E731
    if mode == "token-mean":
        return (loss * mask).sum() / den("tokens")
    if mode == "seq-mean-token-sum":
        return (loss * mask).sum() / den("rows")
    if mode == "seq-mean-token-mean":
        if bool((mask.sum(-1) <= 0).any()):
            raise DareError(
                "loss_agg_mode seq-mean-token-mean: a row has no response token (its "
                "token mean is 0/0); use token-mean or keep a token in every response"
            )
        return ((loss * mask).sum(-1) / mask.sum(-1)).sum() / den("rows")
    if mode == "seq-mean-token-sum-norm":
        return (loss * mask).sum() / den("cells")
    raise ValueError(f"unknown loss aggregation {mode!r}")


class ClippedPolicyLoss:
    r"""PPO clipped surrogate with dual clip, per token (Schulman et al. 2017; Ye et al. 2020).

    For each Monte-Carlo sample ``m``, with per-token log-likelihood surrogates ``ℓ`` (new) and
    ``ℓ_old`` and the sequence advantage ``A`` broadcast over the response:

    .. math::
        r = e^{ℓ - ℓ_{old}},\quad
        L_{clip} = \max(-A r,\; -A\,\mathrm{clip}(r, 1-ε_{low}, 1+ε_{high})),\quad
        L = \begin{cases} \min(-A c, L_{clip}) & A < 0 \\ L_{clip} & A \ge 0 \end{cases}

    aggregated with ``agg_loss`` (token-mean by default; ``totals``: :func:`mask_totals`) and
    averaged over the ``M`` samples.

    Inputs: ``logp``/``old_logp`` ``[M, B, R]``; ``advantages`` ``[B]``; ``mask`` ``[B, R]``.
    Metrics: ``pg_clipfrac`` (fraction of tokens where the clipped branch is active),
    ``ppo_kl`` (k3 estimate ``e^d − d − 1`` with ``d = ℓ_ref − ℓ``, or ``d = ℓ_old − ℓ`` without
    reference log-probs), ``pg_clipfrac_lower`` (dual clip active),
    ``ratio_mean``/``ratio_max``.
    """

    def __init__(
        self,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        clip_ratio_c: float = 3.0,
        agg: AggMode = "token-mean",
    ):
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
        self.eps_low = clip_ratio_low
        self.eps_high = clip_ratio_high
        self.c = clip_ratio_c
        self.agg = agg

    def token_losses(self, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor):
        neg_kl = logp - old_logp
        ratio = torch.exp(neg_kl)
        l1 = -adv * ratio
        l2 = -adv * ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high)
        lclip = torch.maximum(l1, l2)
        l3 = -adv * self.c
        loss = torch.where(adv < 0, torch.minimum(l3, lclip), lclip)
        return loss, ratio, neg_kl, l1, l2, lclip, l3

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """:func:`mask_totals` of ``mask``."""
        return mask_totals(mask)

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        if logp.dim() == 2:
            logp, old_logp = logp.unsqueeze(0), old_logp.unsqueeze(0)
        kl_to = old_logp if ref_logp is None else ref_logp.to(logp.dtype).expand_as(logp)
        adv = advantages.to(logp.dtype)[None, :, None].expand_as(logp)
        mask = mask.to(logp.dtype)
        total = logp.new_zeros(())
        stats = {"pg_clipfrac": 0.0, "ppo_kl": 0.0, "pg_clipfrac_lower": 0.0, "ratio_mean": 0.0}
        ratio_max = 0.0
        m_count = logp.shape[0]
        for m in range(m_count):
            loss, ratio, neg_kl, l1, l2, lclip, l3 = self.token_losses(logp[m], old_logp[m], adv[m])
            total = total + agg_loss(loss, mask, self.agg, totals)
            with torch.no_grad():
                stats["pg_clipfrac"] += masked_mean((l2 > l1).to(mask.dtype), mask).item()
                d = kl_to[m] - logp[m]
                stats["ppo_kl"] += masked_mean(torch.exp(d) - d - 1.0, mask).item()
                stats["pg_clipfrac_lower"] += masked_mean(((lclip > l3) & (adv[m] < 0)).to(mask.dtype), mask).item()
                valid = mask > 0
                if valid.any():
                    ratio_max = max(ratio_max, ratio[valid].max().item())
                    stats["ratio_mean"] += ratio[valid].mean().item()
        return total / m_count, {**{k: v / m_count for k, v in stats.items()}, "ratio_max": ratio_max}


KL_KINDS = ("k1", "k2", "k3", "low_var_kl", "abs", "dare_log1p_k1", "dare_log1p_abs", "dare_log1p_k2", "dare_log1p_k3")


def _k3(d: torch.Tensor, floor: float = -20.0) -> torch.Tensor:
    """``e^{-d} + d - 1``, continued by its tangent below ``d = floor`` (finite value and gradient)."""
    dc = d.clamp_min(floor)
    return torch.expm1(-dc) + dc - torch.expm1(-dc) * (d - dc)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, advantages: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    r"""Per-token estimate of ``KL(π ‖ π_ref)`` from log-likelihood surrogates of tokens drawn from π.

    With ``d = ℓ - ℓ_ref`` (Schulman's estimators, http://joschu.net/blog/kl-approx.html):
    ``k1 = d``, ``k2 = d²/2``, ``k3 = e^{-d} + d - 1`` (unbiased, ≥ 0; arXiv:2402.03300
    Eq. 4, and arXiv:2504.12216 with β = 0.04), ``abs = |d|``, ``low_var_kl`` = verl's k3
    clamped to [-10, 10]. Every kind is finite with a finite gradient for finite inputs: k3 is exact
    for ``d ≥ -20`` nats and continues along its tangent below.

    ``dare_log1p_<k1|abs|k2|k3>``: the DARE reference's rule, the estimator applied to
    ``k = log(1 + d)`` where ``A > 0`` and ``k = d`` elsewhere (k3 clamped to [-10, 10]). It is not
    a KL and is undefined for ``d ≤ -1`` where ``A > 0`` (the reference's NaN): there it raises.

    ``logp``/``ref_logp``: ``[..., B, R]``; ``advantages``: broadcastable to them (read by the
    ``dare_log1p_*`` kinds only); ``kind``: one of :data:`KL_KINDS`. Returns ``[..., B, R]``.
    """
    d = logp - ref_logp
    base = kind.removeprefix("dare_log1p_")
    if kind not in KL_KINDS:
        raise DareError(f"unknown kl penalty {kind!r}; use one of {', '.join(KL_KINDS)}")
    if base != kind:
        pos = advantages.to(d.dtype) > 0
        if bool((pos & (d <= -1)).any()):
            raise DareError(
                f"kl_type={kind}: log(1 + ℓ - ℓ_ref) is undefined where ℓ - ℓ_ref ≤ -1 "
                "and A > 0 (the reference gives NaN); use kl_type=k3"
            )
        d = torch.where(pos, torch.log1p(torch.where(pos, d, torch.zeros_like(d))), d)
    if base == "k1":
        return d
    if base == "abs":
        return d.abs()
    if base == "k2":
        return 0.5 * d.square()
    return _k3(d) if kind == "k3" else _k3(d).clamp(-10.0, 10.0)
