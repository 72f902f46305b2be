r"""myalgo: REINFORCE with a group-mean baseline on the one-step response log-likelihood.

(Written by ``dare plugin new algorithm``: replace this docstring with your method, written like
the paper's method section.)

Setting. For a prompt ``x`` the rollout samples a group of ``n`` responses ``y_1 … y_n``
(``trainer.group_size``) with rewards ``r_1 … r_n``.

1. **Advantage** (core ``group_norm`` with ``norm_by_std=False``): the group mean is the baseline,

   .. math:: A_i = r_i - \frac1n \sum_{k=1}^{n} r_k .

2. **Corruption** (this plugin's ``myalgo_mask_response``): every valid response token is
   replaced by the family's forward noise (``wrapper.noise``), the prompt is kept:
   ``x̃_i = [x | MASK … MASK]`` for an absorbing family, uniform random tokens for a uniform-noise
   one. Either way the response carries no information about ``y``.

3. **Likelihood** (core ``response_token_logprob``): one forward of ``x̃_i`` gives, for every
   response position ``j``, the one-step mean-field log-probability

   .. math:: \ell_{i,j} = \log p_θ(y_{i,j} \mid x̃_i).

4. **Loss** (this plugin's ``myalgo_pg``), aggregated over the valid response tokens
   (``m_{i,j} = 1``) of the whole mini-batch with ``loss_agg_mode`` (token-mean by default):

   .. math:: \mathcal L = -\frac{\sum_{i,j} m_{i,j} A_i \ell_{i,j}}{\sum_{i,j} m_{i,j}} .

   The denominator is the mini-batch's: the loss declares what it divides by (``totals``, here
   :func:`~dare_core.api.mask_totals`), the RL loop sums it over the micro-batches and ranks and
   passes the sum to every call, so the gradient does not depend on ``trainer.micro_batch_size``
   or the number of processes.

   Its gradient is the REINFORCE estimator with baseline, ``-Σ A_i ∇ log π(y_i|x)`` up to the
   normaliser, where ``log π(y|x)`` is replaced by the mean-field sum ``Σ_j ℓ_{i,j}``. There is
   no importance ratio and no clipping, so the update is only unbiased on-policy: keep
   ``trainer.ppo_epochs = 1`` and ``trainer.mini_batch_size = 0`` (the recipe's values).

References: R. J. Williams, "Simple statistical gradient-following algorithms for connectionist
reinforcement learning", Machine Learning 8 (1992) 229–256 (REINFORCE); the one-step mean-field
estimate of a masked-diffusion model's log-likelihood follows Zhao et al. 2025, arXiv:2504.12216.

Shapes: ``B`` sequences, ``P`` padded prompt length, ``R`` response length, ``S = P + R``,
``M`` corruption rows (1 here).
"""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.api import Corrupted, RLComponents, SequenceBatch, agg_loss, mask_totals, masked_mean
from dare_plugin_myalgo.config import AGG_MODES, MyalgoConfig


class MaskWholeResponse:
    """Corruption ``myalgo_mask_response``: noise every valid response token, keep the prompt.

    ``noisy_ids[0, b, i]`` is the family's noise (``wrapper.noise``: the mask token, or a uniform
    random token) where ``i ≥ P`` and the response token is valid, else the clean id; ``masked``
    marks those positions; ``p_mask`` is 1 there and 0 elsewhere. One row (``M = 1``) is enough:
    the positions are fixed and the response carries no information about ``y`` whatever the
    noise. Shapes ``[1, B, S]``. Drawn once per rollout batch by the RL loop and shared by the
    old and new likelihood evaluations.
    """

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        masked = torch.zeros_like(ids, dtype=torch.bool)
        masked[:, batch.prompt_len :] = batch.response_mask.bool()
        noisy = wrapper.noise(ids[None], masked[None], generator)
        return Corrupted(noisy, masked[None], masked[None].to(torch.float32))


class ReinforceLoss:
    r"""Loss ``myalgo_pg``: REINFORCE with the advantage as a fixed weight, per token.

    .. math:: \mathcal L = \frac1M \sum_m \mathrm{agg}\big(-A_b\,\ell_{m,b,j};\ m_{b,j}\big)

    Inputs: ``logp``/``old_logp`` ``[M, B, R]`` (or ``[B, R]``), ``advantages`` ``[B]``,
    ``mask`` ``[B, R]``, ``totals`` the mini-batch's :meth:`totals` (``None``: these rows').
    ``old_logp`` only feeds the ``ratio_mean`` diagnostic (1.0 on-policy);
    ``ref_logp`` is ignored. Metrics: ``logp_mean`` (token-mean of ``ℓ``), ``ratio_mean``.
    """

    def __init__(self, agg: str = "token-mean"):
        if agg not in AGG_MODES:
            raise ValueError(f"agg must be one of {', '.join(AGG_MODES)}, got {agg!r}")
        self.agg = agg

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """What :func:`~dare_core.api.agg_loss` divides by: token, row and cell counts of ``mask``."""
        return mask_totals(mask)

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: Optional[torch.Tensor],
        ref_logp: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict] = None,
    ):
        if logp.dim() == 2:
            logp = logp.unsqueeze(0)
            old_logp = old_logp.unsqueeze(0) if old_logp is not None else None
        adv = advantages.to(logp.dtype)[:, None]  # [B, 1], broadcast over the response
        mask = mask.to(logp.dtype)
        rows = [agg_loss(-adv * logp[m], mask, self.agg, totals) for m in range(logp.shape[0])]
        loss = torch.stack(rows).mean()
        with torch.no_grad():
            metrics = {"logp_mean": float(masked_mean(logp.mean(0), mask))}
            if old_logp is not None:
                metrics["ratio_mean"] = float(masked_mean(torch.exp(logp - old_logp).mean(0), mask))
        return loss, metrics


def build(cfg: MyalgoConfig, lookup) -> RLComponents:
    """Compose the run's components (``lookup`` is a ComponentLookup): each role builds the one
    name the spec declares for it (``AlgorithmSpec.components`` in the manifest), two of this
    plugin's and three of the core's, with this config's options. Nothing here imports another
    plugin."""
    return RLComponents(
        corruption=lookup.corruption(),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(),
        loss=lookup.loss(agg=cfg.loss_agg_mode),
        advantage=lookup.advantage(norm_by_std=cfg.norm_adv_by_std, eps=cfg.adv_eps),
        needs_ref=False,  # no KL term: the RL loop skips the reference model
    )
