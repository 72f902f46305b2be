"""Uniform-noise diffusion SFT (the published DiffusionGemma objective).

For a model with the ``uniform_noise`` capability the SFT step is:

1. **Noise**: the core's ``random_ratio`` corruption — per sequence ``t = (1 - ε) u + ε``, every
   valid response token replaced with probability ``t`` by the wrapper's noise, which for these
   models is a token drawn uniformly from the vocabulary (D3PM-uniform kernel, Austin et al. 2021,
   arXiv:2107.03006; NeMo AutoModel's ``corrupt_uniform_random``). :class:`TargetTokens` records
   the number of valid response tokens per row (``extras["target_tokens"]``).
2. **Forward**: the core's ``response_token_logprob`` estimator, ``log p_θ(y_j | x̃)`` at every
   response position from the wrapper's training layout with ``clean_ids`` and ``prompt_len``
   (DiffusionGemma: the encoder over the clean sequence, the decoder over the corrupted response
   canvases, each seeing the clean prompt and earlier canvases).
3. **Loss** (:class:`UniformDiffusionCE`): the flat mean cross entropy over every valid response
   token of the step (all micro-batches and ranks), corrupted or not, without a ``1/t`` weight
   (NeMo AutoModel's ``BlockDiffusionCrossEntropyLoss``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dare_core.api import Corrupted, SequenceBatch

__all__ = ["TargetTokens", "UniformDiffusionCE", "response_totals"]


def response_totals(batch: SequenceBatch) -> dict[str, torch.Tensor]:
    """The SFT losses' normaliser of ``batch``'s rows: ``{"tokens": Σ response_mask}`` (the trained
    response tokens, float64 scalar); the loop sums it over micro-batches and ranks."""
    return {"tokens": batch.response_mask.to(torch.float64).sum()}


class TargetTokens:
    """A corruption plus ``extras["target_tokens"]`` ``[M, B]``: the valid response tokens of each
    row (what :class:`UniformDiffusionCE` averages over; its presence selects that loss)."""

    def __init__(self, corruption: Any):
        self.corruption = corruption

    def __call__(self, wrapper: Any, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        out = self.corruption(wrapper, batch, generator)
        count = batch.response_mask.sum(-1).to(torch.float32)
        out.extras["target_tokens"] = count[None].expand(out.num_samples, -1).clone()
        return out


class UniformDiffusionCE:
    r"""Flat cross entropy of uniform-noise diffusion (module docstring, step 3):

    .. math::
        \mathcal L = \frac{\sum_{m,b}\sum_{j} v_{b,j}\,\big(-\log p_θ(y_{b,j}\mid x̃_{m,b})\big)}{M\, T_{tokens}},
        \qquad T_{tokens} = \sum_{b' ∈ \text{step}} \sum_j v_{b',j}

    with ``v`` the valid response tokens (``batch.response_mask``, trained EOS padding included);
    ``b`` runs over this call's rows, ``T_tokens`` (``totals["tokens"]``, :func:`response_totals`)
    over the step's rows on every rank. ``logp``: ``[M, B, R]`` per response token. Metrics:
    ``nll`` (mean CE over these rows' valid tokens), ``nll_noised`` (mean
    CE over the corrupted tokens) and ``noised_tokens``.
    """

    def totals(self, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        """:func:`response_totals` of ``batch``."""
        return response_totals(batch)

    def __call__(
        self,
        logp: torch.Tensor,
        corrupted: Corrupted,
        batch: SequenceBatch,
        *,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        valid = batch.response_mask.to(logp.dtype)[None].expand_as(logp)
        tokens = (response_totals(batch) if totals is None else totals)["tokens"].to(logp)
        loss = (-logp * valid).sum() / (logp.shape[0] * tokens).clamp_min(1.0)
        with torch.no_grad():
            noised = corrupted.masked[:, :, batch.prompt_len :].to(logp.dtype) * valid
            k = noised.sum()
            nll_noised = (-logp * noised).sum() / k.clamp_min(1.0)
            nll = (-logp * valid).sum() / valid.sum().clamp_min(1.0)
        return loss, {"nll": float(nll), "nll_noised": float(nll_noised), "noised_tokens": float(k)}
