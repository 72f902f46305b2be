"""Building blocks of ELBO-based objectives: stratified mask counts, subset masking, the
sequence-level ELBO estimator, Monte-Carlo row selection, constant-memory gradient accumulation
and the diagnostics every ELBO method logs.

Shapes: ``M`` Monte-Carlo rows, ``B`` sequences, ``S = P + R`` positions, ``R`` response length.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from dare_core.api import Corrupted, SequenceBatch, mask_totals

#: ``estimate(rows)`` evaluates the algorithm's estimator on the given Monte-Carlo rows only
#: (with gradients unless the caller disables them) and returns ``[len(rows), B, ...]``.
RowEstimate = Callable[[Sequence[int]], torch.Tensor]


# --------------------------------------------------------------------------- mask counts
def cyclic_stratified_counts(k: int, modulus: int, n: int, offset: int = 0) -> torch.Tensor:
    r"""``n`` stratified integers: ``x = round(linspace(k, k + (n-1)·modulus/n, n))`` mapped
    cyclically into ``[offset, offset + modulus)`` by ``((x - offset) mod modulus) + offset``.

    ``round`` is half-to-even (``torch.round``). With ``offset=1, modulus=L`` these are the
    per-group mask counts in ``1..L``; with ``offset=0, modulus=L+1`` the across-batch stratified counts in
    ``0..L``. Returns a ``[n]`` long tensor.
    """
    if modulus < 1 or n < 1:
        raise ValueError(f"modulus and n must be >= 1, got {modulus} and {n}")
    x = torch.round(torch.linspace(float(k), k + (n - 1) * modulus / n, n, dtype=torch.float64))
    return (torch.remainder(x.long() - offset, modulus) + offset).long()


def cyclic_levels(u: float, n: int) -> torch.Tensor:
    """``τ_c = (u + c/n) mod 1`` for ``c = 0..n-1`` (cyclic stratification of one uniform)."""
    c = torch.arange(n, dtype=torch.float64)
    return torch.remainder(u + c / n, 1.0)


def random_subset(valid: torch.Tensor, counts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A boolean mask choosing, independently per row, a uniformly random subset of exactly
    ``counts[...]`` positions among the True positions of ``valid``.

    ``valid``: ``[..., S]`` bool; ``counts``: ``[...]`` long with ``0 <= counts <= valid.sum(-1)``.
    """
    if bool((counts > valid.sum(-1)).any()) or bool((counts < 0).any()):
        raise ValueError("random_subset: a count exceeds the number of valid positions")
    scores = torch.rand(valid.shape, generator=generator, dtype=torch.float64).to(valid.device)
    scores = torch.where(valid, scores, torch.full_like(scores, 2.0))
    rank = scores.argsort(-1).argsort(-1)
    return (rank < counts[..., None]) & valid


def response_valid(batch: SequenceBatch) -> torch.Tensor:
    """``[B, S]`` bool: the valid response positions of ``batch``."""
    out = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    out[:, batch.prompt_len :] = batch.response_mask.bool()
    return out


class StratifiedCountMasking:
    r"""Stratified-count corruption (Zhu et al. 2025, arXiv:2505.19223): per sequence with ``L`` valid response tokens and per group of
    ``n_l`` rows, draw ``k ~ U{1..L}`` and use the counts
    ``x = ((round(linspace(k, k + (n_l-1)L/n_l, n_l)) − 1) mod L) + 1``; row ``i`` masks a
    uniformly random subset of exactly ``x_i`` valid response tokens (the prompt is never
    masked) and ``p_mask = x_i / L`` on the row's valid response positions. ``[M, B, S]``;
    ``extras["counts"]`` is ``[M, B]``. The chosen tokens get the family's noise
    (``wrapper.noise``: the mask token of an absorbing family); the ELBO weights ``1/p_mask`` are
    the estimator's (:class:`SequenceELBO`, which needs ``absorbing_elbo``).
    """

    def __init__(self, mc_num: int = 16, n_l: int = 16):
        if mc_num < 1 or n_l < 1 or mc_num % n_l:
            raise ValueError(f"n_l={n_l} must divide mc_num={mc_num}")
        self.mc_num = mc_num
        self.n_l = n_l

    def __call__(self, wrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        ids = batch.input_ids
        B, S = ids.shape
        M = self.mc_num
        valid = response_valid(batch)
        lengths = valid.sum(-1).cpu()
        counts = torch.zeros(M, B, dtype=torch.long)
        for b in range(B):
            L = int(lengths[b])
            if L == 0:
                continue
            for g in range(M // self.n_l):
                k = int(torch.randint(1, L + 1, (1,), generator=generator))
                counts[g * self.n_l : (g + 1) * self.n_l, b] = cyclic_stratified_counts(k, L, self.n_l, offset=1)
        masked = random_subset(valid[None].expand(M, B, S).cpu(), counts, generator).to(ids.device)
        p = counts.float() / lengths.clamp_min(1).float()[None]
        p_mask = torch.where(valid[None], p.to(ids.device)[:, :, None].expand(M, B, S), torch.zeros(()))
        return Corrupted(
            wrapper.noise(ids.expand(M, B, S), masked, generator), masked, p_mask, {"counts": counts.to(ids.device)}
        )


# --------------------------------------------------------------------------- Monte-Carlo rows
def sequence_elbo(logp: torch.Tensor, masked: torch.Tensor, p_mask: torch.Tensor) -> torch.Tensor:
    r"""Importance-weighted ELBO per row: ``E_{m,b} = Σ_{j ∈ 𝓜_{m,b}} log p_{m,b,j} / p_{m,b,j}``.

    ``logp``, ``masked``, ``p_mask``: ``[M, B, R]`` over the response. Positions not masked (and
    padding) contribute 0; a row with no masked token gives 0. Returns ``[M, B]``.
    """
    w = torch.where(masked, 1.0 / p_mask.clamp_min(1e-12), torch.zeros((), device=logp.device))
    return (torch.where(masked, logp, torch.zeros((), device=logp.device)) * w).sum(-1)


class SequenceELBO:
    r"""Monte-Carlo ELBO of the response, one value per corruption row (``granularity =
    "sequence"``):

    .. math:: Ê_{m,b} = \frac{1}{N_b}\sum_{j\in\mathcal M_{m,b}} \frac{\log p_θ(y_{b,j}\mid x̃_{m,b})}{p_{m,b,j}}

    over the corrupted *response* positions ``𝓜`` with their masking probabilities ``p``. The
    bound is the absorbing-state (MASK) ELBO, so the component requires ``absorbing_elbo``: under a
    uniform-noise kernel the ``1/p``-weighted sum over noised tokens bounds nothing.
    Normaliser ``N_b`` (``norm``): ``none`` → 1; ``padded`` → ``R`` (padded response length);
    ``valid`` → the number of valid response tokens of ``b``; ``auto`` → ``padded`` for
    ``masked`` wrappers and ``valid`` for ``block`` wrappers. Returns ``[M, B]``; one forward
    per row through ``wrapper.token_logprobs`` (block wrappers build their own layout).
    """

    granularity = "sequence"

    def __init__(self, norm: str = "none"):
        if norm not in ("none", "padded", "valid", "auto"):
            raise ValueError(f"norm must be one of none, padded, valid, auto; got {norm!r}")
        self.norm = norm

    def normaliser(self, wrapper, batch: SequenceBatch) -> torch.Tensor:
        mode = self.norm
        if mode == "auto":
            mode = "valid" if getattr(wrapper, "kind", "masked") == "block" else "padded"
        resp = batch.response_mask
        if mode == "padded":
            return torch.full((resp.shape[0],), float(resp.shape[1]), device=resp.device)
        if mode == "valid":
            return resp.float().sum(-1).clamp_min(1.0)
        return torch.ones(resp.shape[0], device=resp.device)

    def __call__(self, wrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        if corrupted is None:
            raise ValueError("the sequence ELBO needs a corruption")
        P = batch.prompt_len
        rows = []
        for m in range(corrupted.num_samples):
            lp = wrapper.token_logprobs(
                corrupted.noisy_ids[m], batch.input_ids, batch.attention_mask, clean_ids=batch.input_ids, prompt_len=P
            )[:, P:]
            masked = corrupted.masked[m, :, P:] & batch.response_mask.bool()
            rows.append(sequence_elbo(lp[None], masked[None], corrupted.p_mask[m, :, P:][None])[0])
        return torch.stack(rows, 0) / self.normaliser(wrapper, batch)[None]


# --------------------------------------------------------------------------- clipped surrogate
def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip: Optional[float] = None
):
    r"""PPO surrogate for an arbitrary ratio ``ρ`` (elementwise):
    ``L = max(-Aρ, -A clip(ρ, 1-ε_low, 1+ε_high))`` and, when ``dual_clip = c`` is given,
    ``min(-A c, L)`` where ``A < 0``.

    Returns ``(loss, clipped, dual)``: the loss and boolean tensors marking where the clipped
    branch is strictly larger (``pg_clipfrac``) and where the dual clip is active.
    """
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(l1, l2)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        l3 = -adv * dual_clip
        dual = (adv < 0) & (loss > l3)
        loss = torch.where(adv < 0, torch.minimum(l3, loss), loss)
    return loss, l2 > l1, dual


# --------------------------------------------------------------------------- accumulation
def proxy_backward(
    estimate: RowEstimate,
    num_rows: int,
    objective: Callable,
    scale: float,
    values: Optional[torch.Tensor] = None,
    backward: Callable = torch.Tensor.backward,
):
    r"""Exact gradient of an objective of the row-mean ``Ê = (1/M) Σ_m e_m`` with one row's graph
    alive at a time (the "proxy-gradient" trick).

    1. ``e = estimate(all rows)`` without gradients (or ``values`` if given), ``[M, B]``;
    2. a leaf ``z = mean_m e_m`` and ``(loss, metrics) = objective(z, e)``;
       ``g = ∂(scale·loss)/∂z``;
    3. for each row ``m``: recompute ``e_m`` with gradients and backpropagate ``Σ_b g_b e_{m,b} / M``.

    Requires a deterministic estimator (no dropout). Returns ``(loss.detach(), metrics)``.
    """
    if values is None:
        with torch.no_grad():
            values = estimate(list(range(num_rows)))
    z = values.detach().float().mean(0).requires_grad_(True)
    loss, metrics = objective(z, values.detach())
    (g,) = torch.autograd.grad(loss * scale, z)
    if not bool(torch.isfinite(g).all()):
        metrics = dict(metrics)
        metrics["proxy_grad_nonfinite"] = float((~torch.isfinite(g)).sum())
    for m in range(num_rows):
        row = estimate([m])[0]
        if row.requires_grad:
            backward((g.to(row.dtype) * row).sum() / num_rows)
    return loss.detach(), metrics


def per_row_backward(
    estimate: RowEstimate, num_rows: int, row_loss: Callable, scale: float, backward: Callable = torch.Tensor.backward
):
    r"""``(1/M) Σ_m row_loss(e_m, m)`` with a backward after each row, so only one row's graph is
    alive at a time and memory does not grow with ``M``. ``row_loss(e_m [B, ...], m) ->
    (loss, metrics)``; metrics are averaged over rows. Returns ``(loss.detach(), metrics)``."""
    total = 0.0
    agg: dict[str, float] = {}
    for m in range(num_rows):
        e = estimate([m])[0]
        loss, metrics = row_loss(e, m)
        if loss.requires_grad:
            backward(loss * (scale / num_rows))
        total = total + loss.detach() / num_rows
        for k, v in metrics.items():
            agg[k] = agg.get(k, 0.0) + float(v) / num_rows
    return torch.as_tensor(total), agg


# --------------------------------------------------------------------------- diagnostics
def mc_diagnostics(rows: torch.Tensor, prefix: str = "elbo") -> dict[str, float]:
    """Statistics of per-row estimates ``[M, B]``: ``{prefix}_mean``, ``{prefix}_mc_var`` (mean
    over sequences of the unbiased variance across the ``M`` rows; 0 when ``M = 1``),
    ``{prefix}_mc_std_rel`` (MC std relative to ``|mean|``) and ``{prefix}_nonfinite`` (count of
    non-finite entries)."""
    rows = rows.detach().float()
    finite = torch.isfinite(rows)
    out = {f"{prefix}_nonfinite": float((~finite).sum())}
    vals = torch.where(finite, rows, torch.zeros((), device=rows.device))
    out[f"{prefix}_mean"] = float(vals.mean()) if vals.numel() else 0.0
    if rows.shape[0] > 1:
        var = vals.var(0, unbiased=True)
        out[f"{prefix}_mc_var"] = float(var.mean())
        out[f"{prefix}_mc_std_rel"] = float((var.sqrt() / vals.mean(0).abs().clamp_min(1e-8)).mean())
    else:
        out[f"{prefix}_mc_var"] = 0.0
        out[f"{prefix}_mc_std_rel"] = 0.0
    return out


def ratio_diagnostics(ratio: torch.Tensor, weights: Optional[torch.Tensor] = None) -> dict[str, float]:
    """``ratio_mean`` (weighted), ``ratio_min``, ``ratio_max`` over finite entries with weight
    > 0, and ``ratio_nonfinite`` (count)."""
    ratio = ratio.detach().float()
    w = torch.ones_like(ratio) if weights is None else weights.detach().float().expand_as(ratio)
    sel = w > 0
    fin = torch.isfinite(ratio) & sel
    out = {"ratio_nonfinite": float((~torch.isfinite(ratio) & sel).sum())}
    if bool(fin.any()):
        r = ratio[fin]
        out["ratio_mean"] = float((r * w[fin]).sum() / w[fin].sum())
        out["ratio_min"] = float(r.min())
        out["ratio_max"] = float(r.max())
    else:
        out.update(ratio_mean=math.nan, ratio_min=math.nan, ratio_max=math.nan)
    return out


def sequence_kl(elbo: torch.Tensor, ref_elbo: torch.Tensor, kind: str = "k2") -> torch.Tensor:
    r"""Sequence-level KL estimate between policy and reference ELBOs, per sequence.

    With ``Δ = Ê − Ê_ref``: ``k1`` → ``Δ``; ``abs`` → ``|Δ|``; ``k2`` → ``Δ²/2``;
    ``k3`` → ``e^{−Δ} + Δ − 1`` (all on log-likelihood surrogates, no clamping).
    """
    d = elbo - ref_elbo
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return torch.exp(-d) + d - 1.0
    raise ValueError(f"unknown sequence KL {kind!r}; valid: k1, abs, k2, k3")


class RowMeanObjective:
    """Base of losses defined on the row mean ``Ê = (1/M) Σ_m e_m`` of ``[M, B]`` estimates.

    Subclasses implement ``objective(elbo, rows, old_rows, ref_rows, advantages, mask, *, totals)
    -> (loss, metrics)`` with ``elbo`` ``[B]`` (differentiable), ``rows`` the detached ``[M, B]``
    values and ``totals`` the mini-batch's (:meth:`totals` summed over micro-batches and ranks;
    a mean over sequences is ``Σ_b / totals["rows"]``). ``__call__`` evaluates it with every row's
    graph alive; ``accumulate`` gives the same gradient through :func:`proxy_backward` with one
    row's graph at a time.
    """

    def objective(self, elbo, rows, old_rows, ref_rows, advantages, mask, *, totals):  # pragma: no cover
        raise NotImplementedError

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """:func:`~dare_core.api.mask_totals` of ``mask`` (``rows``: the sequence count)."""
        return mask_totals(mask)

    def __call__(
        self,
        logp,
        old_logp,
        ref_logp: Optional[torch.Tensor],
        advantages,
        mask,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict] = None,
    ):
        totals = self.totals(mask, extras) if totals is None else totals
        return self.objective(logp.mean(0), logp.detach(), old_logp, ref_logp, advantages, mask, totals=totals)

    #: ``accumulate`` takes ``old_logp=None`` (policy unchanged since the rollout): the first,
    #: gradient-free pass over all rows then doubles as the old log-likelihoods
    computes_own_old = True

    def accumulate(
        self,
        estimate: RowEstimate,
        num_rows: int,
        old_logp,
        ref_logp,
        advantages,
        mask,
        scale: float,
        *,
        extras: Optional[dict] = None,
        backward: Callable = torch.Tensor.backward,
        totals: Optional[dict] = None,
    ):
        totals = self.totals(mask, extras) if totals is None else totals
        values = None
        if old_logp is None:
            with torch.no_grad():
                values = estimate(list(range(num_rows)))
            old_logp = values.detach()

        def objective(z, rows):
            return self.objective(z, rows, old_logp, ref_logp, advantages, mask, totals=totals)

        return proxy_backward(estimate, num_rows, objective, scale, values=values, backward=backward)
