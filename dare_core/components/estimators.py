"""Generic likelihood estimators; both read log-probabilities through ``wrapper.token_logprobs``,
so family differences (logit shift, block layouts, fused heads) stay in the model wrapper."""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.interfaces import Corrupted, SequenceBatch


def corrupted_logprobs(wrapper, batch: SequenceBatch, corrupted: Corrupted) -> torch.Tensor:
    """``log p(x_i | noisy_m)`` for every Monte-Carlo row ``m`` and position ``i``: ``[M, B, S]``."""
    return torch.stack(
        [
            wrapper.token_logprobs(
                corrupted.noisy_ids[m],
                batch.input_ids,
                batch.attention_mask,
                clean_ids=batch.input_ids,
                prompt_len=batch.prompt_len,
            )
            for m in range(corrupted.num_samples)
        ],
        0,
    )


class ResponseTokenLogProb:
    """One-step per-token estimate of the response log-likelihood: for each corruption row ``m``,
    ``ℓ_{m,b,j} = log p_θ(y_{b,j} | x̃_{m,b})`` at every response position ``j`` from one forward of
    the corrupted sequence ``x̃`` (a mean-field approximation when the whole response is masked);
    ``[M, B, R]``, no normaliser (the policy loss aggregates over tokens)."""

    granularity = "token"

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None:
            raise ValueError("the response-token estimator needs a corruption")
        return corrupted_logprobs(wrapper, batch, corrupted)[:, :, batch.prompt_len :]


class MaskedTokenLogProb:
    """``log p_θ(x_i | x̃_m)`` at the corrupted positions, 0 elsewhere: ``[M, B, S]``; the building
    block of ELBO objectives (the objective divides by ``p_mask`` and chooses the normaliser)."""

    granularity = "token"

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None:
            raise ValueError("the masked-token estimator needs a corruption")
        logp = corrupted_logprobs(wrapper, batch, corrupted)
        return torch.where(corrupted.masked, logp, torch.zeros_like(logp))
