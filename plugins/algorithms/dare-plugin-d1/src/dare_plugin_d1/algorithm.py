"""d1 / diffu-GRPO (Zhao et al. 2025, "d1: Scaling Reasoning in Diffusion Large Language Models
via Reinforcement Learning", arXiv:2504.12216).

GRPO where the per-token log-probability of a sampled completion is a one-step mean-field
estimate: mask the whole completion and a random fraction of the prompt, and read
``log p(y_j | ·)`` at every completion position from a single forward. The prompt masking is drawn
anew for each inner update (PPO epoch; the paper's μ, its regulariser) and shared by that update's
old, reference and new log-probabilities, all computed before the first update as d1's code does
(``remask_each_update=false``: one masking per rollout batch). The completion ends at its first
EOS (``truncate_at_eos``): rewards read the text up to it and the loss counts its tokens only,
while the forward sees the whole masked completion the sampler generated.

"Mask" is the family's forward noise (``wrapper.noise``). On a uniform-noise family
(``uniform_noise``, no MASK token) the completion becomes uniform random tokens: the kernel's fully
noised state, which like the all-MASK completion carries no information about ``y``, so
``log p(y_j | ·)`` is still the one-step (mean-field) prediction of the clean completion from the
prompt alone; the prompt gets random tokens at rate ``p`` instead of MASK, the same random
perturbation per draw that the paper uses as a regulariser.
"""

from __future__ import annotations

import torch

from dare_core.api import Corrupted, RLComponents, RolloutBatch, SequenceBatch, TrainingRows, TrajectoryContext
from dare_objectives.policy_options import PenalizedClippedLoss
from dare_plugin_d1.config import D1Config


class D1Masking:
    """The d1 corruption: each valid prompt token is masked i.i.d. with probability ``p``;
    every valid response token is masked (masked = the family's noise, ``wrapper.noise``).
    ``p_mask = p`` on valid prompt tokens, 1 on valid response tokens, 0 on padding. Shapes
    ``[M, B, S]``."""

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
        noisy = wrapper.noise(ids.expand(masked.shape), masked, generator)
        p_row = torch.where(is_prompt, torch.full((B, S), self.p, device=dev), torch.ones(B, S, device=dev))
        p_mask = torch.where(valid, p_row, torch.zeros((), device=dev))[None].expand(self.mc_num, B, S)
        return Corrupted(noisy, masked, p_mask.clone())


class CompletionRows:
    """d1's training rows: the final ``[prompt | completion]`` sequence with every generated
    completion position attended (the forward sees the whole masked completion, as d1's code), and
    the loss weights of the rollout's response mask (``[B, R]``, 1 up to and including the first
    EOS under ``truncate_at_eos``: d1's ``completion_mask``)."""

    records: frozenset[str] = frozenset()

    def rows(self, wrapper, rollout: RolloutBatch, context: TrajectoryContext) -> TrainingRows:
        seq = rollout.sequences()
        canvas = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], 1).long()
        return TrainingRows(
            SequenceBatch(seq.input_ids, canvas, seq.prompt_len),
            context.advantages,
            weights=rollout.response_mask.float(),
        )


#: d1's objective is the core's clipped surrogate per Monte-Carlo draw plus the optional dLLM KL
#: penalty (:class:`dare_objectives.policy_options.PenalizedClippedLoss`).
D1Loss = PenalizedClippedLoss


def build(cfg: D1Config, lookup) -> RLComponents:
    clipped = lookup.loss(
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        clip_ratio_c=cfg.clip_ratio_c,
        agg=cfg.loss_agg_mode,
    )
    return RLComponents(
        corruption=lookup.corruption(p_mask_prompt=cfg.p_mask_prompt, mc_num=cfg.mc_num),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(),
        loss=D1Loss(clipped, cfg.kl_coef, cfg.kl_type, cfg.loss_agg_mode),
        advantage=lookup.advantage(norm_by_std=cfg.norm_adv_by_std),
        needs_ref=cfg.kl_coef > 0,
        remask_each_epoch=cfg.remask_each_update,
    )
