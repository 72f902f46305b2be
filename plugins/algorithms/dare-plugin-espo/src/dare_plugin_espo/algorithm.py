"""ESPO (arXiv:2512.03759, ML-GSAI/ESPO): sequence-level PPO for diffusion LLMs.

The action is the whole response; its log-likelihood is a variance-reduced ELBO (each corruption
is paired with its complement, and mask counts are stratified across the batch) normalised by the
response length, and the ratio, clipping and KL are all applied at sequence level. Advantages are
leave-one-out (RLOO).
"""

from __future__ import annotations

import torch

from dare_core.api import Corrupted, DareError, RLComponents, SequenceBatch
from dare_objectives.elbo import (
    RowMeanObjective,
    clipped_surrogate,
    cyclic_stratified_counts,
    mc_diagnostics,
    random_subset,
    ratio_diagnostics,
    response_valid,
    sequence_kl,
)
from dare_plugin_espo.config import ESPOConfig


class ComplementMasking:
    r"""ESPO corruption over the whole batch, ``mc_num`` times, each set followed by its complement.

    With ``L_b`` valid response tokens: when every row has the same ``L``, draw ``k ~ U{0..L}``
    and take ``x = round(linspace(k, k + (B−1)(L+1)/B, B)) mod (L+1)`` (stratified across the
    batch, 0 allowed); otherwise ``x_b ~ U{0..L_b}`` independently. Row ``2m`` masks a uniformly
    random ``x_b``-subset of the valid response with ``p_mask = x_b/(L_b+1)``; row ``2m+1`` masks
    the complement with ``p_mask = (L_b − x_b)/(L_b+1)``. The prompt is never masked. Masked
    tokens get the family's noise (``wrapper.noise``; ESPO itself requires ``absorbing_elbo``).
    Returns ``[2·mc_num, B, S]``; ``extras["counts"]`` ``[2·mc_num, B]`` masked per row.
    """

    def __init__(self, mc_num: int = 2):
        self.mc_num = mc_num

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        valid = response_valid(batch).cpu()
        lengths = valid.sum(-1)
        same = bool((lengths == lengths[0]).all())
        rows, ps, counts = [], [], []
        for _ in range(self.mc_num):
            if same:
                L = int(lengths[0])
                k = int(torch.randint(0, L + 1, (1,), generator=generator))
                x = cyclic_stratified_counts(k, L + 1, B, offset=0)
            else:
                x = torch.stack([torch.randint(0, int(L) + 1, (1,), generator=generator)[0] for L in lengths])
            chosen = random_subset(valid, x, generator)
            denom = (lengths + 1).float()
            rows += [chosen, valid & ~chosen]
            ps += [x.float() / denom, (lengths - x).float() / denom]
            counts += [x, lengths - x]
        masked = torch.stack(rows, 0)
        p = torch.stack(ps, 0)[:, :, None].expand(masked.shape)
        p_mask = torch.where(valid[None], p, torch.zeros(()))
        dev = ids.device
        masked = masked.to(dev)
        return Corrupted(
            wrapper.noise(ids.expand(masked.shape), masked, generator),
            masked,
            p_mask.to(dev),
            {"counts": torch.stack(counts, 0).to(dev)},
        )


def _check_length(length: float) -> None:
    if not length > 0:
        raise DareError(
            f"ESPO normalises by the response length R, which is {length}; "
            "generate at least one response token (rollout length > 0)"
        )


def espo_kl(elbo: torch.Tensor, ref_elbo: torch.Tensor, length: float, kind: str = "k2") -> torch.Tensor:
    r"""ESPO's KL per sequence on *raw* ELBOs, divided by the padded length ``R``:
    ``k(Ê, Ê_ref)/R`` with ``k2 = Δ²/2``, ``k3 = e^{−Δ} + Δ − 1`` and
    ``k1 = Δ + (Ê − sg(Ê))(sg(Ê) − Ê_ref)`` (value ``Δ``, gradient ``(1 + Δ)∇Ê``).
    ``R <= 0``: a one-line ``DareError`` (the reference's ``compute_espo_kl`` refuses it too)."""
    _check_length(length)
    if kind == "k1":
        k = (elbo - ref_elbo) + (elbo - elbo.detach()) * (elbo.detach() - ref_elbo)
    else:
        k = sequence_kl(elbo, ref_elbo, kind)
    return k / length


class ESPOLoss(RowMeanObjective):
    r"""ESPO on ELBO rows ``[2M, B]`` (mask/complement pairs) with ``Ê = mean_rows``:

    .. math::
        ℓ = Ê/R,\quad r = e^{ℓ − ℓ_{old}},\quad
        \mathcal L = \frac1N \sum_b \max(−A_b r_b, −A_b\,\mathrm{clip}(r_b, 1−ε, 1+ε))
                    + \frac{β}{N} \sum_b k(Ê_b, Ê^{ref}_b)/R

    (no dual clip; ``R`` the padded response length, ``R = 0`` refused; ``N = totals["rows"]``,
    the sequences of the whole mini-batch summed over micro-batches and ranks, so the gradient
    does not depend on the micro-batch size or the world size). Metrics, over this call's rows:
    clip fraction, ratio statistics, k3 KL to the old policy, the Monte-Carlo variance of the
    paired ELBOs, non-finite counts.
    """

    def __init__(self, clip_ratio: float = 0.2, kl_coef: float = 0.0, kl_type: str = "k2"):
        self.eps = clip_ratio
        self.kl_coef = kl_coef
        self.kl_type = kl_type

    def objective(self, elbo, rows, old_rows, ref_rows, advantages, mask, *, totals):
        R = float(mask.shape[-1])
        _check_length(R)
        n = totals["rows"].to(elbo.dtype)
        ell = elbo / R
        old = old_rows.mean(0).to(elbo.dtype) / R
        ratio = torch.exp(ell - old)
        per_row, clipped, _ = clipped_surrogate(ratio, advantages.to(elbo.dtype), self.eps, self.eps)
        loss = per_row.sum() / n
        with torch.no_grad():
            d = (ell - old).detach()
            metrics = {"pg_clipfrac": float(clipped.float().mean()), "ppo_kl": float((torch.exp(-d) + d - 1.0).mean())}
            metrics.update(ratio_diagnostics(ratio))
            pairs = rows[: rows.shape[0] // 2 * 2].reshape(-1, 2, rows.shape[-1]).mean(1)
            metrics.update(mc_diagnostics(pairs, "elbo"))
        if self.kl_coef > 0:
            if ref_rows is None:
                raise DareError("ESPO with kl_coef > 0 needs reference ELBOs; the loop passed none")
            kl = espo_kl(elbo, ref_rows.mean(0).to(elbo.dtype), R, self.kl_type).sum() / n
            loss = loss + self.kl_coef * kl
            metrics["kl_loss"] = float(kl.detach())
        return loss, metrics


def build(cfg: ESPOConfig, lookup) -> RLComponents:
    loss = lookup.loss(clip_ratio=cfg.clip_ratio, kl_coef=cfg.kl_coef, kl_type=cfg.kl_type)
    return RLComponents(
        corruption=lookup.corruption(mc_num=cfg.mc_num),
        trajectory=lookup.trajectory(),
        estimator=lookup.estimator(norm="none"),
        loss=loss,
        accumulate=loss,
        advantage=lookup.advantage(),
        needs_ref=cfg.kl_coef > 0,
    )
