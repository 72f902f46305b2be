"""Coupled-GRPO (Gong et al. 2025, "DiffuCoder: Understanding and Improving Masked Diffusion
Models for Code Generation", arXiv:2506.20639).

GRPO whose per-token log-likelihood is scored under a pair of *complementary* masks: a random
fraction ``t`` of the response is masked in one row, the rest in the other, so every response
token is predicted exactly once at a partial mask level; the fully masked (one-step) estimate is
added and the two are averaged. The three rows are drawn for each PPO epoch (``seed_mode=stream``;
once per rollout batch with ``fixed``), all before the first update, and shared by that epoch's old,
reference and new log-likelihoods.

"Masked" means replaced by the family's forward noise (``wrapper.noise``), so the algorithm also
runs on a uniform-noise family (``uniform_noise``, no MASK token); :class:`CoupledTokenLogProb`
says what the estimate is there.
"""

from __future__ import annotations

import random
from typing import Optional

import torch

from dare_core.api import Corrupted, RLComponents, SequenceBatch
from dare_objectives.policy_options import advantage_from_options, build_clipped_objective
from dare_plugin_coupled_grpo.config import CoupledConfig


class CoupledMasking:
    r"""The three coupled rows, shapes ``[3, B, S]``:

    * row 0: every valid response token masked, ``p_mask = 1``;
    * row 1: valid response tokens with ``u < t`` masked, ``p_mask = t``;
    * row 2: the complement (valid response tokens with ``u ≥ t``), ``p_mask = 1 - t``.

    ``u ~ U(0, 1)`` per position. Prompt and padding are never masked (the reference also masks
    padding positions, which its packed forward drops anyway). ``extras["t"]`` is ``[3, B]``.
    Masked positions get the family's noise (``wrapper.noise``: MASK, or uniform random tokens).

    Seeds: ``seed_mode="stream"`` (default) draws ``t`` per sequence and ``u`` per position from
    ``generator``, fresh at every rollout batch, as DiffuCoder's code does with ``random_masking``
    (which draws one ``t`` per batch). ``"fixed"`` is the DARE reference's: ``t =
    Random(seed).uniform(t_low, t_high)`` and ``u = rand((1, S))`` from a private
    ``torch.Generator`` seeded with ``seed`` at *every* call, as the reference does after its
    global ``set_seed(42)`` — one mask for the whole run — but without touching any global or run
    random stream (a uniform-noise family's random tokens come from that private generator too).
    """

    def __init__(self, t_low: float = 0.2, t_high: float = 0.8, seed_mode: str = "stream", seed: int = 42):
        if not 0.0 < t_low < t_high < 1.0:
            raise ValueError(f"need 0 < t_low < t_high < 1, got {t_low}, {t_high}")
        if seed_mode not in ("fixed", "stream"):
            raise ValueError(f"seed_mode must be 'fixed' or 'stream', got {seed_mode!r}")
        self.t_low, self.t_high = t_low, t_high
        self.seed_mode = seed_mode
        self.seed = seed

    def draw(self, B: int, S: int, generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(t [B], u [B, S])`` on the CPU."""
        if self.seed_mode == "fixed":
            t = torch.full((B,), random.Random(self.seed).uniform(self.t_low, self.t_high), dtype=torch.float64)
            u = torch.rand((1, S), generator=torch.Generator().manual_seed(self.seed)).expand(B, S)
            return t, u
        t = self.t_low + (self.t_high - self.t_low) * torch.rand(B, generator=generator, dtype=torch.float64)
        u = torch.rand((B, S), generator=generator)
        return t, u

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        dev = ids.device
        completion = torch.zeros(B, S, dtype=torch.bool, device=dev)
        completion[:, batch.prompt_len :] = batch.response_mask.bool()
        t, u = self.draw(B, S, generator)
        t, u = t.to(dev), u.to(dev)
        below = u < t[:, None].to(u.dtype)
        masked = torch.stack([completion, completion & below, completion & ~below])
        tf = t.to(torch.float32)[:, None].expand(B, S)
        p_mask = torch.stack([torch.ones(B, S, device=dev), tf, 1.0 - tf]) * masked
        noise_gen = torch.Generator().manual_seed(self.seed) if self.seed_mode == "fixed" else generator
        noisy = wrapper.noise(ids.expand(masked.shape), masked, noise_gen)
        return Corrupted(noisy, masked, p_mask, {"t": t.to(torch.float32)[None].expand(3, B).clone()})


class CoupledTokenLogProb:
    r"""Coupled per-token log-likelihood estimate, ``[1, B, R]``:

    .. math::
        \ell_j = \tfrac12\Big(\ell^{(0)}_j + \tfrac{1}{t}\ell^{(1)}_j[j∈M_1]
                 + \tfrac{1}{1-t}\ell^{(2)}_j[j∈M_2]\Big)

    where ``ℓ^{(m)}_j = log p_θ(y_j | row m)``. ``M_1``/``M_2`` partition the response, so each
    token gets the full-mask term plus exactly one importance-weighted partial-mask term. The three
    rows go through the model in one batched call; block-diffusion wrappers receive the final
    sequence as the clean half of their ``[noisy | clean]`` layout.

    Token ``j`` lands in ``M_1`` with probability ``t`` and in ``M_2`` with probability ``1 - t``,
    so ``ℓ^{(1)}_j[j∈M_1]/t`` and ``ℓ^{(2)}_j[j∈M_2]/(1-t)`` are inverse-probability-weighted,
    unbiased estimates of ``E[log p_θ(y_j | x̃_s) | j noised]`` at noise levels ``s = t`` and
    ``s = 1 - t``, for any forward kernel. With MASK noise these are the per-token integrands of the
    absorbing-state ELBO at those levels (the paper's ``1/t`` weights, DiffuCoder arXiv:2506.20639, Sec. 4). With uniform
    noise (``uniform_noise``) the noised positions hold random tokens and ``ℓ^{(0)}`` predicts ``y``
    from an uninformative response; the three terms are the same per-token denoising
    log-likelihoods under that kernel, but not terms of an ELBO (the uniform-state bound weights
    its terms differently and scores unnoised positions too), so the estimate is a per-token
    log-likelihood surrogate for GRPO's ratio, not a bound.
    """

    granularity = "token"

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None or corrupted.num_samples != 3:
            raise ValueError("the coupled estimator needs the three rows of coupled_masking")
        M, B, S = corrupted.noisy_ids.shape
        P = batch.prompt_len
        rep = lambda x: x.repeat(M, 1)  # noqa: E731 - row-major stacking of the three rows
        logp = wrapper.token_logprobs(
            corrupted.noisy_ids.reshape(M * B, S),
            rep(batch.input_ids),
            rep(batch.attention_mask),
            clean_ids=rep(batch.input_ids),
            prompt_len=P,
        ).reshape(M, B, S)[:, :, P:]
        masked = corrupted.masked[:, :, P:]
        t = corrupted.extras["t"][0].to(logp.dtype)[:, None]
        zero = torch.zeros_like(logp[0])
        part = torch.where(masked[1], logp[1] / t, zero) + torch.where(masked[2], logp[2] / (1.0 - t), zero)
        return ((logp[0] + part) / 2.0)[None]


def build(cfg: CoupledConfig, lookup) -> RLComponents:
    return RLComponents(
        corruption=lookup.corruption(t_low=cfg.t_low, t_high=cfg.t_high, seed_mode=cfg.seed_mode, seed=cfg.seed),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(),
        loss=build_clipped_objective(cfg, lookup),
        advantage=advantage_from_options(cfg, lookup),
        needs_ref=cfg.kl_coef > 0,
        # DiffuCoder's code draws a mask seed per inner iteration; one fixed mask needs no redraw
        remask_each_epoch=cfg.seed_mode == "stream",
    )
