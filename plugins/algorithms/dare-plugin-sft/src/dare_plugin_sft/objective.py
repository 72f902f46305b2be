"""Masked-diffusion supervised fine-tuning: the negative ELBO (NELBO).

Nie et al. 2025, "Large Language Diffusion Models" (arXiv:2502.09992), SFT recipe; the block
variant is Arriola et al. 2025, "Block Diffusion" (arXiv:2503.09573), reached through the model
wrapper's training layout; uniform-noise models train the flat cross entropy of
:mod:`dare_plugin_sft.uniform`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from dare_core.api import Corrupted, SequenceBatch, SFTComponents, default_collate
from dare_plugin_sft.block import KindDispatch
from dare_plugin_sft.config import SFTConfig
from dare_plugin_sft.uniform import TargetTokens, response_totals


class NELBOLoss:
    r"""Masked-diffusion NELBO, normalised by the trained response tokens of the whole step.

    .. math::
        \mathcal L = \frac{\sum_{m,b}\sum_{j\in\mathcal M_{m,b}} -\log p_θ(x_{b,j}\mid x̃_{m,b}) / t_{m,b}}
                          {M\, \max(1, T_{tokens})},\qquad T_{tokens} = \sum_{b' ∈ \text{step}} |\text{answer}_{b'}|

    where ``t`` is the masking probability (``p_mask``), ``𝓜`` the masked positions and
    ``|answer_b|`` the trained response tokens of row ``b`` (``batch.response_mask``); ``b`` runs
    over this call's rows, ``T_tokens`` (``totals["tokens"]``,
    :func:`~dare_plugin_sft.uniform.response_totals`) over the step's rows on every rank. The
    normaliser is the answer length, as in the LLaDA SFT guidelines (arXiv:2502.09992; per answer
    there, summed over the step here): the number of masked tokens (the DARE reference's choice) is
    random and known only after the corruption, so it cannot be summed over the step beforehand.

    ``logp``: ``[M, B, S]`` log-probabilities at masked positions (0 elsewhere).
    Metrics: ``nll`` (mean CE at masked positions, unweighted) and ``masked_tokens``.
    """

    def totals(self, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        """:func:`~dare_plugin_sft.uniform.response_totals` of ``batch``."""
        return response_totals(batch)

    def __call__(
        self,
        logp: torch.Tensor,
        corrupted: Corrupted,
        batch: SequenceBatch,
        *,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        masked = corrupted.masked
        weight = torch.where(masked, 1.0 / corrupted.p_mask.clamp_min(1e-12), torch.zeros(()))
        n = masked.sum()
        tokens = (response_totals(batch) if totals is None else totals)["tokens"].to(logp)
        loss = (-logp * weight).sum() / (logp.shape[0] * tokens).clamp_min(1.0)
        with torch.no_grad():
            nll = (-logp * masked).sum() / (n + 1e-8)
        return loss, {"nll": float(nll), "masked_tokens": float(n)}


def make_collate(cfg: SFTConfig):
    def collate(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], wrapper: Any) -> SequenceBatch:
        fill = wrapper.eos_token_id if cfg.pad_with_eos else wrapper.pad_token_id
        return default_collate(prompts, responses, wrapper, cfg.response_length, fill, train_padding=cfg.pad_with_eos)

    return collate


def build(cfg: SFTConfig, lookup) -> SFTComponents:
    """Masked-diffusion NELBO for ``masked`` models, block-diffusion NELBO for ``block`` models,
    the flat uniform-noise cross entropy for ``uniform_noise`` models (chosen per call from the
    wrapper; :class:`~dare_plugin_sft.block.KindDispatch`)."""
    masked_corruption = lookup.corruption("random_ratio", eps=cfg.eps, mc_num=cfg.mc_num)
    block_corruption = lookup.corruption(
        "block_diffusion_masking", eps=cfg.eps, mc_num=cfg.mc_num, low=cfg.block_t_low, high=cfg.block_t_high
    )
    masked_estimator = lookup.estimator("masked_token_logprob")
    return SFTComponents(
        # random_ratio draws the wrapper's own noise: uniform tokens for uniform-noise models
        corruption=KindDispatch(
            masked_corruption, block_corruption, "corruption", uniform=TargetTokens(masked_corruption)
        ),
        estimator=KindDispatch(
            masked_estimator, masked_estimator, "estimator", uniform=lookup.estimator("response_token_logprob")
        ),
        loss=KindDispatch(
            lookup.loss("nelbo"),
            lookup.loss("block_diffusion_nelbo", weighting=cfg.block_weighting),
            "loss",
            uniform=lookup.loss("uniform_diffusion_ce"),
        ),
        collate=make_collate(cfg),
    )
