"""JustGRPO (LeapLabTHU/JustGRPO, arXiv:2601.15165).

The diffusion model is made to decode strictly left to right, one token per step (semi-AR blocks
of length 1, ``steps = gen_length``); the probability of the sampled response is then exactly
``Π_t p_θ(y_t | prompt, y_<t, MASK…)`` and plain token-level GRPO is applied with these exact
log-probabilities — no ELBO, no mean-field surrogate:

* training rollout: ``RolloutNeeds.adjust`` (:func:`~dare_plugin_justgrpo.config.left_to_right`) forces ``block_length = 1`` and
  ``steps = gen_length`` (and the sampling temperature, see :class:`JustConfig`) on the training
  rollout; evaluation keeps the run's rollout settings;
* trajectory ``step_replay`` with ``left_to_right=True``: state ``t`` = prompt, clean ``y_<t``,
  MASK from ``t`` on; target ``y_t`` (the builder refuses a rollout that did not decode left to
  right);
* estimator ``tempered_token_logprob``: ``ℓ_t = log softmax(logits_t / T)[y_t]`` with the sampling
  temperature ``T`` (the policy that generated the tokens);
* loss ``replay_clipped_pg`` with the ``token_mean`` reduction: the clipped surrogate with dual
  clip, one token mean over every response token of the micro-batch, computed ``row_chunk``
  positions per forward/backward.
"""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.api import Corrupted, DareError, RLComponents, SequenceBatch, gather_logprobs
from dare_objectives.policy_options import advantage_from_options, clip_kwargs
from dare_plugin_justgrpo.config import JustConfig


class TemperedTokenLogProb:
    """``log softmax(logits / T)[y_j]`` at every response position of every state row:
    ``[M, B, R]``. ``temperature`` must be the sampling temperature (the training rollout's);
    calling without one raises. With ``exclude_mask_token`` the mask
    token's logit is removed first (the sampler never proposes it)."""

    granularity = "token"

    def __init__(self, temperature: Optional[float] = None, exclude_mask_token: bool = True):
        self.temperature = temperature
        self.exclude_mask_token = exclude_mask_token

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None:
            raise ValueError("the tempered estimator needs states to score")
        if not self.temperature or self.temperature <= 0:
            raise DareError("the tempered log-probability needs a sampling temperature > 0; set algorithm.temperature")
        P = batch.prompt_len
        rows = []
        for m in range(corrupted.num_samples):
            logits = wrapper.denoise_logits(corrupted.noisy_ids[m], batch.attention_mask, batch.input_ids, P)
            logits = logits[:, P:].float() / self.temperature
            if self.exclude_mask_token:
                logits = logits.index_fill(
                    -1, torch.tensor([wrapper.mask_token_id], device=logits.device), float("-inf")
                )
            rows.append(gather_logprobs(logits, batch.input_ids[:, P:]))
        return torch.stack(rows, 0)


def build(cfg: JustConfig, lookup) -> RLComponents:
    # the training rollout's temperature (config.left_to_right set it; cfg's outside a run)
    temperature = lookup.rollout.temperature if lookup.rollout is not None else cfg.temperature
    estimator = lookup.estimator(temperature=temperature, exclude_mask_token=cfg.exclude_mask_token)
    loss = lookup.loss(kl_coef=cfg.kl_coef, kl_type=cfg.kl_type, row_chunk=cfg.row_chunk, **clip_kwargs(cfg))
    return RLComponents(
        trajectory=lookup.trajectory(reduction="token_mean", left_to_right=True),
        estimator=estimator,
        loss=loss,
        accumulate=loss,
        advantage=advantage_from_options(cfg, lookup),
        needs_ref=cfg.kl_coef > 0,
    )
