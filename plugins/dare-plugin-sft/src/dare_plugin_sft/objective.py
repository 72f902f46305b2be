"""Masked-diffusion supervised fine-tuning: the negative ELBO (NELBO).

Nie et al. 2025, "Large Language Diffusion Models" (arXiv:2502.09992), SFT recipe; the block
variant is Arriola et al. 2025, "Block Diffusion" (arXiv:2503.09573), reached through the model
wrapper's training layout.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from dare_core.api import (
    Components, Corrupted, default_collate, in_range, non_negative, one_of, option, positive,
    SequenceBatch,
)

from dare_plugin_sft.block import KindDispatch


@attrs.frozen
class SFTConfig:
    """Options of the NELBO objective (defaults from the masked-diffusion SFT recipe)."""

    eps: float = option(1e-3, "Noise floor: t = (1 - eps) u + eps with u ~ U(0, 1).",
                        in_range(0.0, 1.0, high_open=True))
    mc_num: int = option(1, "Corruption draws per sequence and step.", positive)
    pad_with_eos: bool = option(
        True, "Pad responses with EOS that is attended and trained (the model learns to fill the "
              "rest of the generation window with EOS); false = pad id, not attended, not trained.")
    response_length: int = option(
        0, "Pad every response to this many tokens (match rollout.gen_length); 0 = longest in batch.",
        non_negative)
    # --- block-diffusion models (wrapper.kind == "block"; see dare_plugin_sft.block) -----------
    block_t_low: float = option(
        0.0, "Block diffusion: lower end of the per-sequence noise level t ~ U(low, high).",
        in_range(0.0, 1.0))
    block_t_high: float = option(
        1.0, "Block diffusion: upper end of t ~ U(low, high); the masking probability is "
             "(1 - eps) t + eps.", in_range(0.0, 1.0))
    block_weighting: str = option(
        "elbo", "Block diffusion loss: 'elbo' = sum CE / p over masked tokens / number of trained "
                "response tokens (BD3LM/SDAR); 'none' = mean CE over masked tokens.",
        one_of(("elbo", "none")))

    def __attrs_post_init__(self) -> None:
        if self.block_t_low > self.block_t_high:
            raise ValueError(f"algorithm.block_t_low ({self.block_t_low}) must not exceed "
                             f"algorithm.block_t_high ({self.block_t_high}); swap them")


class NELBOLoss:
    r"""Masked-diffusion NELBO, normalised by the number of masked tokens.

    .. math::
        \mathcal L = \frac{\sum_{m,b}\sum_{j\in\mathcal M_{m,b}} -\log p_θ(x_{b,j}\mid x̃_{m,b}) / t_{m,b}}
                          {\sum_{m,b} |\mathcal M_{m,b}| + 10^{-8}}

    where ``t`` is the masking probability (``p_mask``) and ``𝓜`` the masked positions. The
    normaliser is the number of masked tokens in the micro-batch (the DARE reference's choice;
    the LLaDA paper divides by the answer length instead).

    ``logp``: ``[M, B, S]`` log-probabilities at masked positions (0 elsewhere).
    Metrics: ``nll`` (mean CE at masked positions, unweighted) and ``masked_tokens``.
    """

    def __call__(self, logp: torch.Tensor, corrupted: Corrupted, batch: SequenceBatch):
        masked = corrupted.masked
        weight = torch.where(masked, 1.0 / corrupted.p_mask.clamp_min(1e-12), torch.zeros(()))
        n = masked.sum()
        loss = (-logp * weight).sum() / (n + 1e-8)
        with torch.no_grad():
            nll = (-logp * masked).sum() / (n + 1e-8)
        return loss, {"nll": float(nll), "masked_tokens": float(n)}


def make_collate(cfg: SFTConfig):
    def collate(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], wrapper: Any) -> SequenceBatch:
        fill = wrapper.eos_token_id if cfg.pad_with_eos else wrapper.pad_token_id
        return default_collate(prompts, responses, wrapper, cfg.response_length, fill,
                               train_padding=cfg.pad_with_eos)

    return collate


def build(cfg: SFTConfig, lookup) -> Components:
    """Masked-diffusion NELBO for ``masked`` models, block-diffusion NELBO for ``block`` models
    (chosen per call from ``wrapper.kind``; :class:`~dare_plugin_sft.block.KindDispatch`)."""
    masked_corruption = lookup.corruption("random_ratio", eps=cfg.eps, mc_num=cfg.mc_num)
    block_corruption = lookup.corruption("block_diffusion_masking", eps=cfg.eps, mc_num=cfg.mc_num,
                                         low=cfg.block_t_low, high=cfg.block_t_high)
    return Components(
        corruption=KindDispatch(masked_corruption, block_corruption, "corruption"),
        trajectory=None,
        estimator=lookup.estimator("masked_token_logprob"),
        loss=KindDispatch(lookup.loss("nelbo"),
                          lookup.loss("block_diffusion_nelbo", weighting=cfg.block_weighting), "loss"),
        collate=make_collate(cfg),
    )


# Recipe: AdamW(lr 1e-4, betas (0.9, 0.95), wd 0.01), cosine schedule with 10% warmup, clip 1.
RECIPE = {
    "trainer": {"lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.01,
                "lr_schedule": "cosine", "warmup_ratio": 0.1, "grad_clip": 1.0},
}
