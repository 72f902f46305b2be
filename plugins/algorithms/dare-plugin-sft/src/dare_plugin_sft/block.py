"""Block-diffusion SFT (BD3LM / SDAR objective: arXiv:2503.09573, arXiv:2510.06303).

For a model of kind ``block`` the SFT step is:

1. **Noise** (:class:`BlockDiffusionMasking`): per sequence ``t ~ U(low, high)`` and
   ``p = (1 - ε) t + ε``; every trainable response token (response attention 1, i.e. "label ≠ -100",
   including EOS padding when it is trained) is replaced by the mask token with probability ``p``.
   Draws are retried up to ``max_tries`` times until at least one token is masked; if none is,
   one eligible position is forced (uniformly). ``p_mask = p`` on eligible positions.
2. **Forward**: the estimator asks the wrapper for ``log p(x | noisy)`` with ``clean_ids`` set, so
   a block wrapper runs its ``[noisy | clean]`` layout with the BD3LM mask and returns the noisy
   half's logits (no shift: the target is the clean token at the same position).
3. **Loss** (:class:`BlockDiffusionNELBO`), normalised by the trainable response tokens of the
   whole step (summed over micro-batches and ranks, :func:`~dare_plugin_sft.uniform.response_totals`):

   .. math::
       \\mathcal L = \\frac{1}{M}\\sum_m \\frac{\\sum_{b}\\sum_{j\\in\\mathcal M_{m,b}} -\\log p_θ(x_{b,j}\\mid x̃_{m,b}) / p_{m,b}}
                                      {\\sum_{b' ∈ \\text{step}} |\\text{answer}_{b'}|}

   with ``|answer_b|`` the number of trainable response tokens of row ``b`` (``weighting="elbo"``,
   the SDAR trainer's ``Σ CE/p / answer_len``), or without the ``1/p`` weight
   (``weighting="none"``, ``Σ CE / Σ|answer|`` over the masked tokens).

:class:`KindDispatch` picks the masked-diffusion, block-diffusion or uniform-noise object
(:mod:`dare_plugin_sft.uniform`) at call time from the wrapper's declared ``uniform_noise``
capability and ``wrapper.kind`` (corruption, estimator) or from the corruption's record (the loss),
so ``--algo sft`` serves every family without naming one.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dare_core.api import Corrupted, SequenceBatch, mask_tokens
from dare_plugin_sft.uniform import response_totals

__all__ = ["BlockDiffusionMasking", "BlockDiffusionNELBO", "KindDispatch", "choose_masks"]


def choose_masks(
    t_tries: torch.Tensor, draws: torch.Tensor, eligible: torch.Tensor, force_u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The retry rule on pre-drawn randomness.

    :param t_tries: ``[T, N]`` masking probabilities of the ``T`` tries for ``N`` sequences.
    :param draws: ``[T, N, S]`` uniforms; try ``k`` masks ``draws[k] < t_tries[k]`` on eligible positions.
    :param eligible: ``[N, S]`` bool.
    :param force_u: ``[N]`` uniforms choosing the forced position when every try masked nothing.
    :returns: ``(masked [N, S] bool, t [N])``: the first try that masks something (else the last try's
        ``t`` with one forced position); rows without eligible positions mask nothing.
    """
    T, N, S = draws.shape
    masks = (draws < t_tries[:, :, None]) & eligible[None]
    hit = masks.any(-1)  # [T, N]
    first = torch.where(hit.any(0), hit.float().argmax(0), torch.full((N,), T - 1, device=draws.device))
    rows = torch.arange(N, device=draws.device)
    masked = masks[first, rows]
    t = t_tries[first, rows]
    n_elig = eligible.sum(-1)
    need = ~masked.any(-1) & (n_elig > 0)
    if bool(need.any()):
        k = (force_u * n_elig).floor().long().clamp(max=(n_elig - 1).clamp_min(0))  # k-th eligible
        rank = eligible.long().cumsum(-1) - 1
        forced = eligible & (rank == k[:, None])
        masked = torch.where(need[:, None], forced, masked)
    return masked, t


class BlockDiffusionMasking:
    """Per-sequence block-diffusion noise with at-least-one-mask retries (module docstring, step 1).

    ``extras``: ``"t"`` ``[M, B]`` and ``"answer_len"`` ``[M, B]`` (trainable tokens per row, the
    loss normaliser). Random stream per call: ``[T, M, B]`` then ``[T, M, B, S]`` then ``[M, B]``
    uniforms from ``generator`` (CPU), ``T = max_tries``.
    """

    def __init__(self, eps: float = 1e-3, mc_num: int = 1, low: float = 0.0, high: float = 1.0, max_tries: int = 10):
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {eps}")
        if mc_num < 1 or max_tries < 1:
            raise ValueError(f"mc_num and max_tries must be >= 1, got {mc_num} and {max_tries}")
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"need 0 <= low <= high <= 1, got low={low}, high={high}")
        self.eps, self.mc_num, self.low, self.high, self.max_tries = eps, mc_num, low, high, max_tries

    def __call__(self, wrapper: Any, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        M, T = self.mc_num, self.max_tries
        dev = ids.device
        eligible = torch.zeros(B, S, dtype=torch.bool, device=dev)
        eligible[:, batch.prompt_len :] = batch.response_mask.bool()
        u = torch.rand(T, M * B, generator=generator).to(dev)
        draws = torch.rand(T, M * B, S, generator=generator).to(dev)
        force_u = torch.rand(M * B, generator=generator).to(dev)
        t = self.low + (self.high - self.low) * u
        p = (1.0 - self.eps) * t + self.eps
        elig = eligible.repeat(M, 1)
        masked, p_row = choose_masks(p, draws, elig, force_u)
        masked = masked.view(M, B, S)
        p_row = p_row.view(M, B)
        noisy = mask_tokens(ids, masked, wrapper.mask_token_id)
        p_mask = torch.where(eligible[None], p_row[:, :, None].expand(M, B, S), torch.zeros((), device=dev))
        answer_len = eligible.sum(-1).to(p_row.dtype).expand(M, B)
        return Corrupted(noisy, masked, p_mask, {"t": p_row, "answer_len": answer_len})


class BlockDiffusionNELBO:
    """Block-diffusion SFT loss (module docstring, step 3).

    ``logp``: ``[M, B, S]`` log-probabilities at masked positions (0 elsewhere), from the
    ``[noisy | clean]`` forward; ``totals``: the step's :func:`~dare_plugin_sft.uniform.response_totals`
    (``None``: ``batch``'s). Metrics: ``nll`` (mean CE over masked tokens) and ``masked_tokens``.
    """

    def __init__(self, weighting: str = "elbo"):
        if weighting not in ("elbo", "none"):
            raise ValueError(f"weighting must be 'elbo' or 'none', got {weighting!r}")
        self.weighting = weighting

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
        n = masked.sum()
        if self.weighting == "elbo":
            weight = torch.where(masked, 1.0 / corrupted.p_mask.clamp_min(1e-12), torch.zeros(()))
        else:
            weight = masked.to(logp.dtype)
        tokens = (response_totals(batch) if totals is None else totals)["tokens"].to(logp)
        loss = (-logp * weight).sum() / (logp.shape[0] * tokens).clamp_min(1.0)
        with torch.no_grad():
            nll = (-logp * masked).sum() / (n + 1e-8)
        return loss, {"nll": float(nll), "masked_tokens": float(n)}


class KindDispatch:
    """Calls the ``uniform``, ``block`` or ``masked`` object of one role.

    As a corruption or an estimator it reads the wrapper: the ``uniform_noise`` capability picks
    ``uniform`` (when given), else ``wrapper.kind == "block"`` picks ``block``. As a loss it reads
    the corruption's record: ``extras["target_tokens"]`` (:class:`~dare_plugin_sft.uniform.TargetTokens`)
    picks ``uniform``, ``extras["answer_len"]`` (the block normaliser) picks ``block``.
    """

    def __init__(self, masked: Any, block: Any, role: str, uniform: Any = None):
        if role not in ("corruption", "estimator", "loss"):
            raise ValueError(f"role must be 'corruption', 'estimator' or 'loss', got {role!r}")
        self.masked, self.block, self.role, self.uniform = masked, block, role, uniform

    def totals(self, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        """As a loss: the step normaliser, :func:`~dare_plugin_sft.uniform.response_totals` (the
        same for the three objects, so no corruption is needed to pick one)."""
        return response_totals(batch)

    def __call__(self, *args: Any, **kwargs: Any):
        if self.role == "loss":
            extras = (args[1] if len(args) > 1 else kwargs["corrupted"]).extras
            pick = "uniform" if "target_tokens" in extras else "block" if "answer_len" in extras else "masked"
        else:
            wrapper = args[0] if args else kwargs["wrapper"]
            if self.uniform is not None and "uniform_noise" in getattr(wrapper, "capabilities", ()):
                pick = "uniform"
            else:
                pick = "block" if getattr(wrapper, "kind", "masked") == "block" else "masked"
        return getattr(self, pick)(*args, **kwargs)
