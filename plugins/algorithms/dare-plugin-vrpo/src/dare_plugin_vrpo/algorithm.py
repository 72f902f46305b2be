"""VRPO: variance-reduced preference optimisation for masked diffusion LMs.

Zhu et al. 2025, "LLaDA 1.5: Variance-Reduced Preference Optimization for Large Language
Diffusion Models" (arXiv:2505.19223). DPO (Rafailov et al. 2023, arXiv:2305.18290) where each
sequence log-likelihood is replaced by a Monte-Carlo ELBO estimate ``B̂``, with two variance
reductions:

* stratified timesteps: the ``mc_num`` rows of a sequence mask the stratified counts
  ``x = ((round(linspace(k, k + (n−1)L/n, n)) − 1) mod L) + 1`` of its ``L`` valid response
  tokens (one ``k ~ U{1..L}`` per group of ``n_l`` rows), so the budget covers distinct noise
  levels instead of repeating one;
* antithetic (shared) noise: the policy and the reference evaluate the *same* corrupted rows
  (the workflow draws the corruption once and passes it to both).

Per row ``i``: ``B_i = Σ_{j∈𝓜_i} log p_θ(y_j | x̃_i) · L / x_i``; ``B̂ = mean_i B_i``. With the
DARE reference's normalisation ``ℓ = B̂ / R`` (``R`` = padded response length):

    loss = mean over pairs of −log σ(β [(ℓ_w − ℓ_l) − (ℓ_w^ref − ℓ_l^ref)])

i.e. the effective β is β/R (a reference quirk; ``normalize=none`` gives plain DPO on ``B̂``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from dare_core.api import PreferenceComponents, SequenceBatch
from dare_objectives.elbo import mc_diagnostics
from dare_plugin_vrpo.config import VRPOConfig


class DPOLoss:
    r"""DPO on likelihood surrogates of interleaved pairs.

    ``logp``, ``ref_logp``: ``[M, 2N]`` per-row sequence surrogates (rows ``2i`` chosen,
    ``2i+1`` rejected), averaged over the ``M`` Monte-Carlo rows first:

    .. math::
        ℓ = \frac1M\sum_m ℓ_m,\qquad
        z_i = (ℓ_{w,i} - ℓ_{l,i}) - (ℓ^{ref}_{w,i} - ℓ^{ref}_{l,i}),\qquad
        \mathcal L = \frac{1}{T_{pairs}}\sum_i -\log σ(β z_i)

    with ``i`` over this call's pairs and ``T_pairs`` (``totals["pairs"]``) the pairs of the
    whole step (all micro-batches and ranks), so the calls of a step add up to its mean loss.

    Metrics: ``dpo_loss``; implicit rewards ``reward_chosen = β(ℓ_w − ℓ_w^{ref})``,
    ``reward_rejected``, ``reward_margin`` (their difference) and ``reward_accuracy`` (fraction
    with chosen reward > rejected reward); policy likelihoods ``logp_chosen``, ``logp_rejected``
    and ``logp_margin = ℓ_w − ℓ_l``; and the Monte-Carlo diagnostics of the per-row estimates
    (``elbo_mc_var``, ``elbo_mc_std_rel``, ``elbo_nonfinite``). Reference: arXiv:2505.19223 Eq. 6.
    """

    def __init__(self, beta: float = 0.2):
        self.beta = beta

    def totals(self, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        """``{"pairs": N}`` (float64) of ``batch``'s ``2N`` interleaved rows."""
        return {"pairs": torch.tensor(batch.batch_size / 2, dtype=torch.float64)}

    def __call__(
        self,
        logp: torch.Tensor,
        ref_logp: torch.Tensor,
        batch: Optional[SequenceBatch] = None,
        *,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        if logp.dim() != 2 or logp.shape[1] % 2:
            raise ValueError(f"DPO needs [M, 2N] sequence values of interleaved pairs, got {tuple(logp.shape)}")
        pol = logp.to(torch.promote_types(logp.dtype, torch.float32)).mean(0)  # fp32 at least
        ref = ref_logp.to(pol).mean(0)
        w, l_ = pol[0::2], pol[1::2]
        rw, rl = ref[0::2], ref[1::2]
        z = (w - l_) - (rw - rl)
        pairs = z.new_tensor(float(z.numel())) if totals is None else totals["pairs"].to(z)
        loss = -F.logsigmoid(self.beta * z).sum() / pairs.clamp_min(1.0)
        with torch.no_grad():
            chosen = self.beta * (w - rw)
            rejected = self.beta * (l_ - rl)
            metrics = {
                "dpo_loss": float(-F.logsigmoid(self.beta * z).mean()),
                "reward_chosen": float(chosen.mean()),
                "reward_rejected": float(rejected.mean()),
                "reward_margin": float((chosen - rejected).mean()),
                "reward_accuracy": float((chosen > rejected).float().mean()),
                "logp_chosen": float(w.mean()),
                "logp_rejected": float(l_.mean()),
                "logp_margin": float((w - l_).mean()),
            }
            metrics.update(mc_diagnostics(logp, "elbo"))
            metrics.pop("elbo_mean", None)
        return loss, metrics


def build(cfg: VRPOConfig, lookup) -> PreferenceComponents:
    return PreferenceComponents(
        corruption=lookup.corruption(mc_num=cfg.mc_num, n_l=cfg.n_l or cfg.mc_num),
        estimator=lookup.estimator(norm=cfg.normalize),
        loss=lookup.loss(beta=cfg.beta),
    )
