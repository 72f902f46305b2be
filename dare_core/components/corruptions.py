"""Generic forward corruption processes (drawn once per batch, shared by every evaluation)."""

from __future__ import annotations

import torch

from dare_core.interfaces import Corrupted, SequenceBatch


def mask_tokens(ids: torch.Tensor, masked: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """``ids`` (``[B, S]``) with the positions of ``masked`` (``[M, B, S]`` or ``[B, S]``)
    replaced by ``mask_token_id``; the result has ``masked``'s shape."""
    return torch.where(masked, torch.full_like(ids, mask_token_id), ids)


class RandomRatioMasking:
    r"""Masked-diffusion forward process with one noise level per sequence: for each Monte-Carlo row
    and sequence draw ``u ~ U(0, 1)``, set ``t = (1 - ε) u + ε`` and replace every valid *response*
    token by the family's noise (``wrapper.noise``: the mask token, or a uniform random token for a
    uniform-noise family) independently with probability ``t`` (a row may have no masked token).
    ``p_mask = t`` on valid response tokens, 0 elsewhere; ``extras["t"]`` is ``[M, B]``."""

    def __init__(self, eps: float = 1e-3, mc_num: int = 1):
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {eps}")
        if mc_num < 1:
            raise ValueError(f"mc_num must be >= 1, got {mc_num}")
        self.eps = eps
        self.mc_num = mc_num

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        M = self.mc_num
        dev = ids.device
        valid = torch.zeros(B, S, dtype=torch.bool, device=dev)
        valid[:, batch.prompt_len :] = batch.response_mask.bool()
        u = torch.rand(M, B, generator=generator, device="cpu").to(dev)
        t = (1.0 - self.eps) * u + self.eps
        draw = torch.rand(M, B, S, generator=generator, device="cpu").to(dev)
        masked = (draw < t[:, :, None]) & valid[None]
        noisy = wrapper.noise(ids.expand(M, B, S), masked, generator)
        p_mask = torch.where(valid[None], t[:, :, None].expand(M, B, S), torch.zeros(()))
        return Corrupted(noisy, masked, p_mask, {"t": t})
