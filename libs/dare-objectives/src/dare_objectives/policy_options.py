"""Options and objective shared by algorithms built on the clipped token-level policy gradient
(importable without torch: algorithm configs inherit these options).

An algorithm config inherits :class:`ClippedObjectiveOptions` to get the clip / aggregation /
advantage / KL fields with the usual recipe defaults, and builds its loss with
:func:`build_clipped_objective` instead of re-declaring them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

import attrs

from dare_core.api import in_range, non_negative, one_of, option

if TYPE_CHECKING:
    import torch

#: ``kl_type`` choices: :data:`dare_core.components.losses.KL_KINDS` (this module imports no torch).
KL_TYPES = ("k1", "k2", "k3", "low_var_kl", "abs", "dare_log1p_k1", "dare_log1p_abs", "dare_log1p_k2", "dare_log1p_k3")

#: The 8-GPU group-RL recipe most dLLM papers share (16 prompts x 8 rollouts, lr 5e-7, wd 0.01, one
#: optimizer step per rollout batch, grad clip 1, rollout temperature 0.6). Copy before changing.
GROUP_RL_RECIPE = {
    "trainer": {
        "lr": 5e-7,
        "weight_decay": 0.01,
        "batch_size": 16,
        "group_size": 8,
        "ppo_epochs": 1,
        "mini_batch_size": 0,
        "grad_clip": 1.0,
    },
    "rollout": {"temperature": 0.6},
}


@attrs.frozen
class ClipOptions:
    """Clip / advantage / KL options of clipped policy-gradient algorithms (recipe defaults:
    ε = 0.2, dual clip 3, group std normalisation, no KL)."""

    clip_ratio_low: float = option(0.2, "PPO clip ε below 1.", in_range(0.0, 1.0, high_open=True))
    clip_ratio_high: float = option(0.2, "PPO clip ε above 1.", non_negative)
    clip_ratio_c: float = option(
        3.0, "Dual-clip constant c for negative advantages (> 1).", in_range(1.0, float("inf"), low_open=True)
    )
    norm_adv_by_std: bool = option(True, "Divide group-centred rewards by the group std.")
    kl_coef: float = option(
        0.0, "Weight of the KL penalty to the initial policy (0 = off, as the recipes).", non_negative
    )
    kl_type: str = option(
        "k3",
        "KL estimator on d = ℓ - ℓ_ref: k3 = e^-d + d - 1 (GRPO's, "
        "arXiv:2402.03300), k1, k2, low_var_kl (verl's clamped k3), abs; dare_log1p_* = the DARE "
        "reference's rule (raises where ℓ - ℓ_ref <= -1 and A > 0).",
        one_of(KL_TYPES),
    )


@attrs.frozen
class ClippedObjectiveOptions(ClipOptions):
    """:class:`ClipOptions` plus the token-loss aggregation of the per-token objective."""

    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        option("token-mean", "Token-loss aggregation.")
    )


class PenalizedClippedLoss:
    r"""The clipped surrogate per Monte-Carlo row, averaged over rows, plus an optional KL penalty.

    .. math::
        \mathcal L = \frac1M\sum_m \mathrm{agg}\big(L^{clip}(\ell_m, \ell^{old}_m, A)\big)
                   + β\,\frac1M\sum_m \mathrm{agg}\big(\mathrm{KL}(\ell_m, \ell^{ref}_m, A)\big)

    with the ``kl_type`` estimator of :func:`~dare_core.components.losses.kl_penalty`; both terms are
    aggregated with the same mini-batch ``totals`` (:func:`~dare_core.api.mask_totals`, the
    normalisation of :func:`~dare_core.api.agg_loss`).
    ``logp``/``old_logp``/``ref_logp``: ``[M, B, R]``; ``advantages``: ``[B]``; ``mask``: ``[B, R]``.
    """

    def __init__(self, clipped: Any, kl_coef: float = 0.0, kl_type: str = "k3", agg: str = "token-mean"):
        self.clipped = clipped
        self.kl_coef = kl_coef
        self.kl_type = kl_type
        self.agg = agg

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """The clipped loss's totals (:func:`~dare_core.api.mask_totals` of ``mask``)."""
        return self.clipped.totals(mask, extras)

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
        loss, metrics = self.clipped(logp, old_logp, ref_logp, advantages, mask, totals=totals)
        if self.kl_coef > 0:
            import torch

            from dare_core.api import agg_loss, kl_penalty

            if ref_logp is None:
                raise ValueError("kl_coef > 0 needs reference log-probabilities")
            if logp.dim() == 2:
                logp, ref_logp = logp[None], ref_logp[None]
            adv = advantages[None, :, None].to(logp.dtype)
            kl = kl_penalty(logp, ref_logp, adv, self.kl_type)
            kl_loss = torch.stack([agg_loss(kl[m], mask, self.agg, totals) for m in range(kl.shape[0])]).mean()
            loss = loss + self.kl_coef * kl_loss
            metrics["kl_loss"] = float(kl_loss.detach())
        return loss, metrics


def clip_kwargs(cfg: ClipOptions) -> dict[str, float]:
    """``clip_ratio_low/high/c`` of ``cfg`` as keyword arguments."""
    return {
        "clip_ratio_low": cfg.clip_ratio_low,
        "clip_ratio_high": cfg.clip_ratio_high,
        "clip_ratio_c": cfg.clip_ratio_c,
    }


def clipped_from_options(cfg: ClipOptions, lookup: Any) -> Any:
    """The loss the algorithm's spec declares (``clipped_pg``), configured from ``cfg``."""
    return lookup.loss(agg=getattr(cfg, "loss_agg_mode", "token-mean"), **clip_kwargs(cfg))


def build_clipped_objective(cfg: ClippedObjectiveOptions, lookup: Any) -> PenalizedClippedLoss:
    """:class:`PenalizedClippedLoss` around the declared ``clipped_pg`` loss (:func:`clipped_from_options`)."""
    return PenalizedClippedLoss(clipped_from_options(cfg, lookup), cfg.kl_coef, cfg.kl_type, cfg.loss_agg_mode)


def advantage_from_options(cfg: ClipOptions, lookup: Any) -> Any:
    """The advantage the algorithm's spec declares (``group_norm`` by default) with
    ``cfg.norm_adv_by_std``."""
    return lookup.advantage(norm_by_std=cfg.norm_adv_by_std)
