"""d1 / diffu-GRPO (Zhao et al. 2025, "d1: Scaling Reasoning in Diffusion Large Language Models
via Reinforcement Learning", arXiv:2504.12216).

GRPO where the per-token log-probability of a sampled completion is a one-step mean-field
estimate: mask the whole completion and a random fraction of the prompt, and read
``log p(y_j | ·)`` at every completion position from a single forward. The corruption is drawn
once per rollout batch and reused for the old and new log-probabilities.
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

from dare_core.api import (
    Components, Corrupted, in_range, mask_tokens, non_negative, one_of, option, positive,
    SequenceBatch,
)
from dare_objectives.policy_options import PenalizedClippedLoss


@attrs.frozen
class D1Config:
    """d1 options with the recipe defaults (LLaDA math recipe)."""

    p_mask_prompt: float = option(
        0.15, "Probability of masking each valid prompt token in the log-prob forward.",
        in_range(0.0, 1.0, high_open=True))
    mc_num: int = option(1, "Corruption draws per rollout (the recipe uses 1).", positive)
    clip_ratio_low: float = option(0.2, "PPO clip ε below 1.", in_range(0.0, 1.0, high_open=True))
    clip_ratio_high: float = option(0.2, "PPO clip ε above 1.", non_negative)
    clip_ratio_c: float = option(3.0, "Dual-clip constant c for negative advantages (> 1).",
                                 in_range(1.0, float("inf"), low_open=True))
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = option("token-mean", "Token-loss aggregation.")
    norm_adv_by_std: bool = option(True, "Divide group-centred rewards by the group std (GRPO).")
    kl_coef: float = option(0.0, "Weight of the KL penalty to the initial policy (0 = off, as the recipe).",
                            non_negative)
    kl_type: str = option("low_var_kl", "KL penalty form.", one_of(("k1", "abs", "k2", "mse", "k3", "low_var_kl")))


class D1Masking:
    """The d1 corruption: each valid prompt token is masked i.i.d. with probability ``p``;
    every valid response token is masked. ``p_mask = p`` on valid prompt tokens, 1 on valid
    response tokens, 0 on padding. Shapes ``[M, B, S]``."""

    def __init__(self, p_mask_prompt: float = 0.15, mc_num: int = 1):
        self.p = p_mask_prompt
        self.mc_num = mc_num

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        P = batch.prompt_len
        dev = ids.device
        valid = batch.attention_mask.bool()
        is_prompt = torch.zeros(B, S, dtype=torch.bool, device=dev)
        is_prompt[:, :P] = True
        draw = torch.rand(self.mc_num, B, S, generator=generator).to(dev)
        masked = valid[None] & (~is_prompt[None] | (draw < self.p))
        noisy = mask_tokens(ids, masked, wrapper.mask_token_id)
        p_row = torch.where(is_prompt, torch.full((B, S), self.p, device=dev), torch.ones(B, S, device=dev))
        p_mask = torch.where(valid, p_row, torch.zeros((), device=dev))[None].expand(self.mc_num, B, S)
        return Corrupted(noisy, masked, p_mask.clone())


#: d1's objective is the core's clipped surrogate per Monte-Carlo draw plus the optional dLLM KL
#: penalty (:class:`dare_objectives.policy_options.PenalizedClippedLoss`).
D1Loss = PenalizedClippedLoss


def build(cfg: D1Config, lookup) -> Components:
    clipped = lookup.loss("clipped_pg", clip_ratio_low=cfg.clip_ratio_low,
                          clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                          agg=cfg.loss_agg_mode)
    return Components(
        corruption=lookup.corruption("d1_masking", p_mask_prompt=cfg.p_mask_prompt, mc_num=cfg.mc_num),
        trajectory=lookup.trajectory("final_sequence"),
        estimator=lookup.estimator("response_token_logprob"),
        loss=D1Loss(clipped, cfg.kl_coef, cfg.kl_type, cfg.loss_agg_mode),
        advantage=lookup.advantage("group_norm", norm_by_std=cfg.norm_adv_by_std),
        needs_ref=cfg.kl_coef > 0,
    )


# Recipe (8 GPUs, LLaDA-8B-Instruct): 16 prompts x 8 rollouts, lr 5e-7, AdamW wd 0.01,
# one optimizer step per rollout batch, grad clip 1, rollout temperature 0.6.
RECIPE = {
    "trainer": {"lr": 5e-7, "weight_decay": 0.01, "batch_size": 16, "group_size": 8,
                "ppo_epochs": 1, "mini_batch_size": 0, "grad_clip": 1.0},
    "rollout": {"temperature": 0.6},
}
