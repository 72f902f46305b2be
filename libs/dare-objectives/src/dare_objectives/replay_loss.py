"""The clipped policy loss over replayed denoising transitions (one corruption row per step).

Inputs per micro-batch: ``logp``/``old_logp``/``ref_logp`` ``[K, B, R]`` (row ``k`` = the
log-probabilities of step ``k``'s targets given the state before it), ``advantages`` ``[B]``,
``weights`` ``[K, B, R]`` (the step's targets, or per-sample transition weights) and the builder's
``extras`` (``replay_reduction``, ``replay_steps``; see
:class:`~dare_objectives.trajectory_replay.StepReplay`).

With the per-token clipped surrogate ``L`` (:class:`~dare_core.components.ClippedPolicyLoss`,
dual clip for ``A < 0``) and the mini-batch's totals ``T`` (:meth:`ReplayClippedLoss.totals`
summed over its micro-batches and ranks: ``W_k = Σ_{b,j} w_{kbj}`` per step, the sample count
``B`` and ``W = Σ_{k,b,j} w_{kbj}``) the reductions are

* ``step_mean``:  ``(1/K) Σ_k Σ_{b,j} w_{kbj} L_{kbj} / W_k`` — the token mean of every step over
  the mini-batch, averaged over the rollout's ``K`` steps (steps without targets count as 0);
* ``per_sample``: ``(1/B) Σ_{k,b,j} w_{kbj} L_{kbj}`` — with transition weights
  ``w = 1/|S|/T_b`` the mean over samples of the mean over each sample's transitions of the mean
  token loss of the transition;
* ``token_mean``: ``Σ_{k,b,j} w L / W`` — one token mean over every replayed token.

Each call returns its rows' share, so the sum over micro-batches and ranks is the mini-batch loss.

All three are sums over steps, so :meth:`ReplayClippedLoss.accumulate` runs one forward and
backward per chunk of ``row_chunk`` steps (memory of one chunk, not of ``K`` forwards). An optional
KL penalty (``kl_type`` of :func:`~dare_core.components.losses.kl_penalty`) is reduced the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from dare_core.api import kl_penalty

REDUCTIONS = {0: "step_mean", 1: "per_sample", 2: "token_mean"}


class ReplayClippedLoss:
    """See the module docstring.

    :param clipped: a :class:`~dare_core.components.ClippedPolicyLoss` (its ``token_losses``).
    :param kl_coef: weight of the KL penalty (needs reference log-probabilities when > 0).
    :param row_chunk: steps per forward/backward in :meth:`accumulate`.
    """

    def __init__(self, clipped: Any, kl_coef: float = 0.0, kl_type: str = "k3", row_chunk: int = 1):
        if row_chunk < 1:
            raise ValueError(f"row_chunk must be >= 1, got {row_chunk}")
        self.clipped = clipped
        self.kl_coef = kl_coef
        self.kl_type = kl_type
        self.row_chunk = row_chunk

    @staticmethod
    def _mode(extras: Optional[dict], weights: torch.Tensor) -> tuple[str, int]:
        if not extras or "replay_reduction" not in extras:
            return "step_mean", weights.shape[0]
        return REDUCTIONS[int(extras["replay_reduction"][0])], int(extras["replay_steps"][0])

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """``step_w``: ``W_k`` ``[K]`` (a scalar for ``[B, R]`` weights shared by every step),
        ``rows``: ``B``, ``tokens``: ``Σ w``, float64."""
        w = mask.to(torch.float64)
        return {
            "step_w": w.sum((-2, -1)),
            "tokens": w.sum(),
            "rows": torch.tensor(float(w.shape[-2]), dtype=torch.float64, device=w.device),
        }

    @staticmethod
    def _reduce(x: torch.Tensor, w: torch.Tensor, mode: str, steps: int, den: torch.Tensor) -> torch.Tensor:
        """Reduce a ``[c, B, R]`` token quantity of ``c`` steps by the mode's denominator ``den``
        (``[c]`` per step or a scalar)."""
        wx = (x * w).flatten(1).sum(-1)  # [c]
        den = den.to(x.dtype).clamp_min(1e-8)
        if mode == "step_mean":
            return (wx / den).sum() / max(1, steps)
        return wx.sum() / den

    @staticmethod
    def _den(totals: dict, mode: str, rows: slice, num_rows: int) -> torch.Tensor:
        """The denominator of steps ``rows`` of ``num_rows`` (weights shared by the steps count
        ``num_rows`` times in the token total)."""
        shared = totals["step_w"].dim() == 0
        if mode == "step_mean":
            return totals["step_w"] if shared else totals["step_w"][rows]
        if mode == "per_sample":
            return totals["rows"]
        return totals["tokens"] * (num_rows if shared else 1)

    def _chunk(self, logp, old, ref, adv, w, mode, steps, den, stats):
        a = adv.to(logp.dtype)[None, :, None].expand_as(logp)
        token, ratio, neg_kl, l1, l2, lclip, l3 = self.clipped.token_losses(logp, old, a)
        value = self._reduce(token, w, mode, steps, den)
        if self.kl_coef > 0:
            if ref is None:
                raise ValueError("kl_coef > 0 needs reference log-probabilities")
            kl = kl_penalty(logp, ref, a, self.kl_type)
            kl_value = self._reduce(kl, w, mode, steps, den)
            value = value + self.kl_coef * kl_value
            stats["kl_loss"] = stats.get("kl_loss", 0.0) + float(kl_value.detach())
        with torch.no_grad():
            wd = w.to(logp.dtype)
            stats["w"] += float(wd.sum())
            stats["pg_clipfrac"] += float(((l2 > l1).to(wd.dtype) * wd).sum())
            stats["ppo_kl"] += float(((torch.exp(-neg_kl) + neg_kl - 1.0) * wd).sum())
            stats["pg_clipfrac_lower"] += float((((lclip > l3) & (a < 0)).to(wd.dtype) * wd).sum())
            stats["ratio_sum"] += float((ratio * wd).sum())
            if bool((wd > 0).any()):
                stats["ratio_max"] = max(stats["ratio_max"], float(ratio[wd > 0].max()))
        return value

    @staticmethod
    def _metrics(stats: dict[str, float]) -> dict[str, float]:
        n = stats["w"] + 1e-8
        out = {k: stats[k] / n for k in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")}
        out["ratio_mean"] = stats["ratio_sum"] / n if stats["w"] > 0 else 1.0
        out["ratio_max"] = stats["ratio_max"]
        if "kl_loss" in stats:
            out["kl_loss"] = stats["kl_loss"]
        return out

    @staticmethod
    def _stats() -> dict[str, float]:
        return {
            "w": 0.0,
            "pg_clipfrac": 0.0,
            "ppo_kl": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ratio_sum": 0.0,
            "ratio_max": 0.0,
        }

    def __call__(
        self,
        logp,
        old_logp,
        ref_logp,
        advantages,
        mask,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict] = None,
    ):
        totals = self.totals(mask, extras) if totals is None else totals
        weights = mask.to(logp.dtype)
        if weights.dim() == 2:
            weights = weights[None].expand_as(logp)
        mode, steps = self._mode(extras, weights)
        stats = self._stats()
        den = self._den(totals, mode, slice(None), logp.shape[0])
        value = self._chunk(logp, old_logp, ref_logp, advantages, weights, mode, steps, den, stats)
        return value, self._metrics(stats)

    #: ``accumulate`` takes ``old_logp=None`` to mean "the policy has not changed since the rollout":
    #: each chunk's own detached log-likelihoods are then the old ones (ratio 1)
    computes_own_old = True

    def accumulate(
        self,
        estimate,
        num_rows: int,
        old_logp,
        ref_logp,
        advantages,
        mask,
        scale: float,
        *,
        extras: Optional[dict] = None,
        backward: Callable = torch.Tensor.backward,
        totals: Optional[dict] = None,
    ):
        """Forward and backward ``row_chunk`` steps at a time; returns the (detached) loss."""
        totals = self.totals(mask, extras) if totals is None else totals
        weights = mask.to(torch.float32)
        if weights.dim() == 2:
            weights = weights[None].expand(num_rows, -1, -1)
        mode, steps = self._mode(extras, weights)
        stats = self._stats()
        total = torch.zeros(())
        for start in range(0, num_rows, self.row_chunk):
            rows = list(range(start, min(num_rows, start + self.row_chunk)))
            w = weights[rows[0] : rows[-1] + 1]
            if not bool((w != 0).any()):
                continue  # no target in this micro-batch: the term is exactly 0
            logp = estimate(rows)
            ref = ref_logp[rows[0] : rows[-1] + 1] if ref_logp is not None else None
            old = logp.detach() if old_logp is None else old_logp[rows[0] : rows[-1] + 1]
            den = self._den(totals, mode, slice(rows[0], rows[-1] + 1), num_rows)
            value = self._chunk(logp, old, ref, advantages, w.to(logp.dtype), mode, steps, den, stats)
            backward(value * scale)
            total = total + value.detach().cpu()
        return total, self._metrics(stats)


def make_replay_clipped_loss(
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    row_chunk: int = 1,
) -> ReplayClippedLoss:
    """Registry factory: :class:`ReplayClippedLoss` around a fresh clipped surrogate."""
    from dare_core.api import ClippedPolicyLoss

    return ReplayClippedLoss(
        ClippedPolicyLoss(clip_ratio_low, clip_ratio_high, clip_ratio_c), kl_coef, kl_type, row_chunk
    )
