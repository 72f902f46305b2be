r"""REINFORCE with the RLOO leave-one-out baseline on a Monte-Carlo masked-token likelihood.

Setting. For a prompt ``x`` the rollout samples ``k`` responses ``y_1 … y_k``
(``trainer.group_size``, ``k ≥ 2``) with rewards ``r_1 … r_k``.

1. **Advantage** — REINFORCE Leave-One-Out (core ``rloo``; Ahmadian et al. 2024, "Back to
   Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
   arXiv:2402.14740, "RLOO_k"): each sample's baseline is the mean reward of the *other*
   ``k - 1`` samples of its group,

   .. math:: A_i = r_i - \frac{1}{k-1}\sum_{j\ne i} r_j = \frac{k}{k-1}\,(r_i - \bar r).

   The baseline does not depend on ``y_i``, so the gradient stays unbiased.

2. **Corruption** (core ``random_ratio``): for each of ``M = mc_num`` rows draw
   ``t_m = (1-ε)u + ε``, ``u ~ U(0,1)``, and mask every valid response token independently with
   probability ``t_m``; ``𝓜_{m,i}`` is the set of masked response positions. Drawn once per
   rollout batch and reused for the old and new evaluations.

3. **Likelihood** (this plugin's ``reinforce_rloo_seq_logprob``), one value per sequence: the
   mean log-probability of the masked response tokens, pooled over the ``M`` rows,

   .. math::
      \ell_i = \frac{\sum_{m=1}^{M}\sum_{j\in\mathcal M_{m,i}} \log p_θ(y_{i,j}\mid x̃_{m,i})}
                    {\sum_{m=1}^{M} |\mathcal M_{m,i}|}
      \qquad (\ell_i = 0 \text{ if no token was masked in any row}).

   This is the Monte-Carlo integrand of the masked-diffusion ELBO
   ``E_t[(1/t) Σ_{j∈𝓜} log p_θ(y_j | x̃_t)] ≤ log π(y|x)`` *without* the ``1/t`` weight and
   normalised by the number of masked tokens: a length-normalised, lower-variance likelihood
   surrogate (not a bound). Normaliser: masked response tokens of the sequence, all rows.
   ``random_ratio`` noises with the family's kernel (``wrapper.noise``); on a uniform-noise family
   (``uniform_noise``) ``𝓜`` are the positions replaced by random tokens and ``ℓ_i`` is the mean
   log-probability of recovering the clean tokens there: the same surrogate, with no ELBO weight
   to lose.

4. **Loss** (this plugin's ``reinforce_rloo_pg``), over a mini-batch of ``B`` sequences (``B``
   counted over all its micro-batches and processes: the loss's ``totals``),

   .. math:: \mathcal L = -\frac1B \sum_{b=1}^{B} A_b\,\ell_b ,

   whose gradient ``-(1/B) Σ A_b ∇ℓ_b`` is the REINFORCE estimator with the sequence
   log-likelihood replaced by ``ℓ``. No importance ratio, no clipping, no KL term: keep the
   update on-policy (``trainer.ppo_epochs = 1``, ``trainer.mini_batch_size = 0``, the recipe).

Shapes: ``B`` sequences, ``P`` padded prompt length, ``R`` response length, ``S = P + R``,
``M`` corruption rows.
"""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.api import Corrupted, RLComponents, SequenceBatch, corrupted_logprobs, mask_totals
from dare_plugin_reinforce_rloo.config import ESTIMATOR, LOSS, ReinforceRLOOConfig


class MaskedMeanSequenceLogProb:
    r"""Estimator ``reinforce_rloo_seq_logprob``: per-sequence mean masked-token log-probability.

    .. math:: \ell_b = \frac{\sum_m \sum_{j} c_{m,b,j}\,\log p_θ(y_{b,j}\mid x̃_{m,b})}
                            {\sum_m \sum_j c_{m,b,j}}

    with ``c_{m,b,j} = 1`` where response position ``j`` of row ``m`` was corrupted (and is a
    valid response token); ``ℓ_b = 0`` where the denominator is 0. Log-probabilities are read
    through ``wrapper.token_logprobs`` (one forward per row), so any model family works.

    Returns ``[1, B]``: the ``M`` rows are already pooled; the batch is on dim 1 as the RL loop
    expects. Normaliser: the number of corrupted response tokens of the sequence over all rows.
    """

    granularity = "sequence"

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None:
            raise ValueError(f"the {ESTIMATOR} estimator needs a corruption")
        P = batch.prompt_len
        logp = corrupted_logprobs(wrapper, batch, corrupted)[:, :, P:]  # [M, B, R]
        hit = corrupted.masked[:, :, P:] & batch.response_mask.bool()[None]  # [M, B, R]
        total = torch.where(hit, logp, torch.zeros_like(logp)).sum(dim=(0, 2))
        count = hit.sum(dim=(0, 2)).to(logp.dtype)
        return (total / count.clamp_min(1.0))[None]


class SequenceReinforceLoss:
    r"""Loss ``reinforce_rloo_pg``: per-sequence REINFORCE, mean over sequences.

    .. math:: \mathcal L = -\frac{1}{M'B}\sum_{m=1}^{M'}\sum_{b=1}^{B} A_b\,\ell_{m,b}

    with ``B = totals["rows"]``, the mini-batch's sequence count (:meth:`totals` summed over its
    micro-batches and ranks; ``None``: these rows'), so each call returns its rows' share.

    Inputs: ``logp`` ``[M', B]`` or ``[B]`` per-sequence log-likelihoods (``M' = 1`` from
    ``reinforce_rloo_seq_logprob``); ``old_logp`` the same shape, used only for the
    ``ratio_mean`` diagnostic (``exp(ℓ - ℓ_old)``, 1.0 on-policy); ``advantages`` ``[B]``;
    ``ref_logp`` and ``mask`` are ignored (the estimator already normalised each sequence).
    Metrics: ``logp_mean``, ``ratio_mean``.
    """

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """The sequence count (``rows``) of ``mask`` ``[B, R]`` (with token and cell counts)."""
        return mask_totals(mask)

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: Optional[torch.Tensor],
        ref_logp: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict] = None,
    ):
        if logp.dim() == 1:
            logp = logp[None]
            old_logp = old_logp[None] if old_logp is not None else None
        if logp.dim() != 2:
            raise ValueError(
                f"{LOSS} takes per-sequence log-likelihoods [M, B], got shape {tuple(logp.shape)}; "
                f"pair it with a sequence-granularity estimator such as {ESTIMATOR}"
            )
        adv = advantages.to(logp.dtype)[None, :]
        rows = float(logp.shape[-1]) if totals is None else totals["rows"].to(logp.dtype)
        loss = -(adv * logp).sum() / (logp.shape[0] * rows)
        with torch.no_grad():
            metrics = {"logp_mean": float(logp.mean())}
            if old_logp is not None:
                metrics["ratio_mean"] = float(torch.exp(logp - old_logp).mean())
        return loss, metrics


def build(cfg: ReinforceRLOOConfig, lookup) -> RLComponents:
    """Core ``random_ratio`` corruption, ``final_sequence`` input and ``rloo`` advantage, with this
    plugin's estimator and loss: the components the spec declares (``AlgorithmSpec.components``)."""
    return RLComponents(
        corruption=lookup.corruption(eps=cfg.eps, mc_num=cfg.mc_num),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(),
        loss=lookup.loss(),
        advantage=lookup.advantage(),
        needs_ref=False,
    )
