"""d-TreeRPO (THU-BPM/d-TreeRPO, arXiv:2512.09675).

Rollouts branch at intermediate denoising steps: the root (prompt + all-MASK response) gets
``num_tree_samples`` children, each denoised over the first segment of steps; every node of a
deeper level gets ``branch_factor`` children denoised over the next segment, until the leaves are
complete responses. Leaf rewards are propagated up (a node's value is the mean of its children's),
each parent → child transition is trained with the child's value minus the mean of its siblings'
values, and a time-scheduled self-distillation term pulls the parent's prediction towards the
tokens of positively rated siblings.

Composition:

* ``RolloutNeeds.wrap`` (:func:`tree_rollout`) → :class:`TreeRollout` around the run's sampler (needs a backend
  with ``continue_from`` and ``total_steps``, e.g. the core ``low_confidence`` and ``block``
  samplers); its leaves are the rollout
  rows, so ``trainer.group_size`` must equal the number of leaves per prompt;
* trajectory ``tree_transitions`` (:class:`TreeTransitions`) — one row per tree edge;
* estimator ``response_token_logprob`` (core) — ``ℓ_j = log p_θ(child_j | parent state)``;
* loss ``tree_loss`` (:class:`TreeLoss`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dare_core.api import (
    Corrupted,
    DareError,
    RLComponents,
    RolloutBatch,
    SequenceBatch,
    TrainingRows,
    TrajectoryContext,
    kl_penalty,
)
from dare_plugin_dtreerpo.config import RESUMABLE, DTreeConfig


def branch_points(total_steps: int, contraction: int) -> list[int]:
    """Remaining-step counts where the tree branches: ``{T} ∪ {T − int(kT/s)}``, descending."""
    return sorted(
        {total_steps} | {total_steps - int(k * total_steps / contraction) for k in range(1, contraction + 1)},
        reverse=True,
    )


def sd_schedule(
    step: int, max_steps: int, lambda_max: float, gamma: float, tau_max: float, beta: float
) -> tuple[float, float]:
    """``(λ_t, τ_t)`` of the self-distillation term at training step ``step``."""
    p = min(1.0, max(0.0, step / max(1, max_steps)))
    lam = lambda_max * (math.exp(gamma * p) - 1.0) / (math.exp(gamma) - 1.0)
    tau = max(tau_max * max(0.0, 1.0 - p) ** beta, 1e-6)
    return lam, tau


class TreeRollout:
    """Branching rollout around a sampler with ``continue_from`` and ``total_steps``.

    ``generate`` takes the run's prompt rows (``leaves`` consecutive rows per prompt, as the RL
    loop lays them out) and returns a :class:`RolloutBatch` whose rows are the tree's leaves, in
    the same group-major order; ``extras["tree_states"]`` lists every level's node states
    ``[G * n_l, R]`` (level 1 first, the leaves last) and ``extras["tree_widths"]`` the children
    per node of each level. ``reveal_step`` is the step at which each leaf token was committed.
    """

    def __init__(self, backend: Any, num_tree_samples: int, branch_factor: int, contraction: int):
        if not all(callable(getattr(backend, m, None)) for m in RESUMABLE):
            raise DareError(
                "dtreerpo branches partial denoising runs and needs a rollout backend "
                "with continue_from and total_steps (the core low_confidence and "
                "block samplers)"
            )
        self.backend = backend
        self.widths = [num_tree_samples] + [branch_factor] * (contraction - 1)
        self.contraction = contraction
        self.leaves = math.prod(self.widths)

    def generate(self, wrapper, prompt_ids, prompt_mask, *, record=frozenset(), generator=None) -> RolloutBatch:
        B = prompt_ids.shape[0]
        if B % self.leaves:
            raise DareError(
                f"the tree has {self.leaves} leaves per prompt but the batch has {B} "
                f"rows; set trainer.group_size={self.leaves}"
            )
        R = self.backend.config.gen_length
        pid, pmask = prompt_ids[:: self.leaves], prompt_mask[:: self.leaves]
        T = self.backend.total_steps(wrapper, pmask)  # e.g. steps x blocks of a block sampler
        bounds = [T - p for p in branch_points(T, self.contraction)]  # ascending global steps
        state = torch.full((pid.shape[0], R), wrapper.mask_token_id, dtype=torch.long, device=pid.device)
        reveal = torch.full_like(state, -1)
        states, nfe = [], 0
        out = None
        for level, width in enumerate(self.widths):
            pid, pmask = pid.repeat_interleave(width, 0), pmask.repeat_interleave(width, 0)
            state, reveal = state.repeat_interleave(width, 0), reveal.repeat_interleave(width, 0)
            out = self.backend.continue_from(
                wrapper, pid, pmask, state, start_step=bounds[level], stop_step=bounds[level + 1], generator=generator
            )
            state = out.response_ids
            reveal = torch.where(out.reveal_step >= 0, out.reveal_step, reveal)
            states.append(state)
            nfe += out.nfe
        return RolloutBatch(
            pid,
            pmask,
            state,
            out.response_mask,
            reveal_step=reveal,
            num_steps=T,
            nfe=nfe,
            extras={"tree_states": states, "tree_widths": list(self.widths)},
        )


def tree_values_and_advantages(leaf_rewards: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    """Per level (level 1 first), the sibling-relative advantage of every node.

    Leaf values are the rewards; a node's value is the mean of its children's values. The
    advantage of a node is its value minus the mean of its siblings' values (0 without siblings);
    no std normalisation.
    """
    values = [leaf_rewards.to(torch.float32)]
    for width in reversed(widths[1:]):
        values.insert(0, values[0].reshape(-1, width).mean(1))
    advs = []
    for v, width in zip(values, widths):
        g = v.reshape(-1, width)
        if width == 1:
            advs.append(torch.zeros_like(v))
            continue
        others = (g.sum(1, keepdim=True) - g) / (width - 1)
        advs.append((g - others).reshape(-1))
    return advs


class TreeTransitions:
    """Trajectory builder: one training row per tree edge, level by level.

    Row of a node at level ``l``: target ``[prompt | node state]``, model input
    ``[prompt | parent state]`` (the all-MASK root for level 1), ``masked`` = positions the
    transition committed (parent MASK, child not), advantage from
    :func:`tree_values_and_advantages`, loss weights = committed positions up to the child's first
    EOS, ``extras``: ``parent_id`` (siblings share it), the self-distillation schedule values
    ``sd_lambda`` / ``sd_tau`` of the current step and the sibling statistics of
    :func:`sibling_distillation` (``sd_weight``, ``sd_logq``, ``sd_cells``), computed here once for
    the whole batch so that siblings are never split by micro-batches or the mini-batch shuffle.
    """

    records: frozenset[str] = frozenset()

    def __init__(self, schedule: Optional[dict] = None):
        self.schedule = schedule or {}

    def rows(self, wrapper, rollout, context: TrajectoryContext) -> TrainingRows:
        if "tree_states" not in rollout.extras:
            raise DareError(
                "dtreerpo trains tree transitions; the training rollout must be its tree rollout (RolloutNeeds.wrap)"
            )
        states, widths = rollout.extras["tree_states"], rollout.extras["tree_widths"]
        advs = tree_values_and_advantages(context.rewards, widths)
        mask_id, eos_id = wrapper.mask_token_id, wrapper.eos_token_id
        leaves = math.prod(widths)
        P = rollout.prompt_ids.shape[1]
        n_groups = rollout.prompt_ids.shape[0] // leaves
        root = torch.full((n_groups, states[0].shape[1]), mask_id, dtype=torch.long, device=states[0].device)
        parents, children, prompts, pmasks, parent_ids, adv = [], [], [], [], [], []
        offset = 0
        prev = root
        for level, (state, width) in enumerate(zip(states, widths)):
            n = state.shape[0]
            per_prompt = n // n_groups
            rows = torch.arange(n) * (leaves // per_prompt)  # a rollout row below each node
            parents.append(prev.repeat_interleave(width, 0))
            children.append(state)
            prompts.append(rollout.prompt_ids[rows])
            pmasks.append(rollout.prompt_mask[rows])
            parent_ids.append(offset + torch.arange(n) // width)
            offset += n // width
            adv.append(advs[level])
            prev = state
        parent, child = torch.cat(parents), torch.cat(children)
        prompt, pmask = torch.cat(prompts), torch.cat(pmasks)
        moved = (parent == mask_id) & (child != mask_id)
        is_eos = child == eos_id
        first = torch.where(
            is_eos.any(1), is_eos.long().argmax(1), torch.full_like(is_eos[:, 0], child.shape[1], dtype=torch.long)
        )
        upto = torch.arange(child.shape[1], device=child.device)[None] <= first[:, None]
        active = moved & upto
        attention = torch.cat([pmask, torch.ones_like(child)], 1)
        batch = SequenceBatch(torch.cat([prompt, child], 1), attention, P)
        noisy = torch.cat([prompt, parent], 1)
        masked = torch.zeros_like(noisy, dtype=torch.bool)
        masked[:, P:] = moved
        corrupted = Corrupted(noisy[None], masked[None], masked[None].float())
        lam, tau = sd_schedule(context.step, **self.schedule) if self.schedule else (0.0, 1.0)
        N = child.shape[0]
        parent_id = torch.cat(parent_ids).to(child.device)
        advantages = torch.cat(adv)
        extras = {
            "parent_id": parent_id,
            "sd_lambda": torch.full((N,), lam, dtype=torch.float64),
            "sd_tau": torch.full((N,), tau, dtype=torch.float64),
            **sibling_distillation(active.float(), advantages, parent_id, child, tau),
        }
        metrics = {"tree_rows": float(N), "sd_lambda": lam}
        return TrainingRows(batch, advantages, corrupted, active.float(), extras, metrics)


def sibling_distillation(
    active: torch.Tensor,
    advantages: torch.Tensor,
    parent_id: torch.Tensor,
    tokens: torch.Tensor,
    tau: float,
    eps: float = 1e-8,
) -> dict[str, torch.Tensor]:
    r"""The self-distillation targets of every sibling group (rows sharing ``parent_id``), as
    row-aligned statistics, so a subset of the rows carries its exact share of the term.

    For a group with at least two rows and positive advantages ``A_s > 0``, at every position ``j``
    where a positive sibling is active (``W_j = Σ_{s: A_s>0} w_s a_sj > 0``, ``w = softmax(A/τ)``
    over the positive siblings): ``q_j(v) = Σ_{s: A_s>0, a_sj, y_sj=v} w_s / W_j`` and
    ``KL_j = Σ_s π_sj (\log q_j(y_sj) − ℓ_sj)``, ``π_sj = w_s a_sj / (W_j + ε)`` — the siblings share
    the parent state, so ``log p_θ(y_sj | parent)`` is sibling ``s``'s own ``ℓ_sj``.

    Args:
        active: ``[N, R]`` active positions; advantages: ``[N]``; parent_id: ``[N]``;
        tokens: ``[N, R]`` child tokens ``y``; tau: the temperature ``τ_t``.

    Returns:
        ``sd_weight`` ``[N, R]`` (``π_sj``, 0 off the positive siblings), ``sd_logq`` ``[N, R]``
        (``log(q_j(y_sj) + ε)``) and ``sd_cells`` ``[N]`` (row ``s``'s credit ``Σ_j w_s a_sj / W_j``
        in the count of (group, position) terms: the credits of a group sum to its number of
        positions with ``W_j > 0``), all float64.
    """
    N, R = active.shape
    f64 = dict(dtype=torch.float64, device=active.device)
    weight, logq, cells = torch.zeros(N, R, **f64), torch.zeros(N, R, **f64), torch.zeros(N, **f64)
    A = torch.nan_to_num(advantages.detach().to(**f64))
    for g in torch.unique(parent_id).tolist():
        idx = (parent_id == g).nonzero().squeeze(-1)
        pos = idx[A[idx] > 0]
        if idx.numel() <= 1 or pos.numel() == 0:
            continue
        act = active[pos] > 0  # [g, R]
        wa = torch.softmax(A[pos] / tau, 0)[:, None] * act  # [g, R]
        W = wa.sum(0)  # [R]
        tok = tokens[pos]
        same = (tok[:, None, :] == tok[None, :, :]) & act[None] & act[:, None]  # [g, g, R]
        q_own = (same * wa[None]).sum(1) / (W + eps)  # q_j(y_sj) for each active s
        weight[pos] = wa / (W + eps) * act
        logq[pos] = torch.where(act, torch.log(q_own + eps), torch.zeros_like(q_own))
        cells[pos] = torch.where(W > 0, wa / W.clamp_min(1e-300), torch.zeros_like(wa)).sum(-1)
    return {"sd_weight": weight, "sd_logq": logq, "sd_cells": cells}


class TreeLoss:
    r"""d-TreeRPO objective (arXiv:2512.09675) of some transitions of a mini-batch (``a`` = active
    positions, ``L_b = max(1, Σ_j a_bj)``, ``r = e^{ℓ − ℓ_old}``, ε = ``clip_ratio``), normalised by
    the whole mini-batch's counts: ``T_rows`` its transitions, ``T_sd`` its (sibling group, position)
    terms (:func:`sibling_distillation`):

    .. math::
        \mathcal L_{pg} = -\frac{1}{T_{rows}} Σ_b Σ_j \min(r A_b, \mathrm{clip}(r, 1-ε, 1+ε) A_b)\, a_{bj} / L_b

    .. math::
        \mathcal L_{kl} = \frac{β}{T_{rows}} Σ_b Σ_j (e^{ℓ_{ref}-ℓ} - (ℓ_{ref}-ℓ) - 1)\, a_{bj} / L_b

    .. math::
        \mathcal L_{sd} = \frac{λ_t}{T_{sd}} Σ_{(group, j)} KL_j
                       = \frac{λ_t}{T_{sd}} Σ_{b,j} π_{bj} (\log q_j(y_{bj}) − ℓ_{bj})

    with ``KL_j = Σ_v q_j(v)(log q_j(v) − log p_θ(v | parent))`` over the positive siblings' tokens,
    ``π`` and ``log q`` the row-aligned ``extras`` of :func:`sibling_distillation` (siblings grouped
    over the whole batch by the trajectory builder). ``b`` runs over this call's rows; summed over
    the calls of a mini-batch the terms are its loss. Total = pg + kl + sd.
    """

    def __init__(self, clip_ratio: float = 0.4, kl_coef: float = 0.01, self_distillation: bool = True):
        self.eps = clip_ratio
        self.kl_coef = kl_coef
        self.self_distillation = self_distillation

    def totals(self, mask: torch.Tensor, extras: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """``{"rows": B, "sd_cells": Σ extras["sd_cells"]}`` (float64) of ``mask`` ``[B, R]``."""
        f64 = dict(dtype=torch.float64, device=mask.device)
        cells = extras["sd_cells"].to(**f64).sum() if extras and "sd_cells" in extras else torch.zeros((), **f64)
        return {"rows": torch.tensor(float(mask.shape[0]), **f64), "sd_cells": cells}

    def __call__(
        self,
        logp,
        old_logp,
        ref_logp,
        advantages,
        mask,
        *,
        extras: Optional[dict] = None,
        totals: Optional[dict[str, torch.Tensor]] = None,
    ):
        if logp.dim() == 3:
            logp, old_logp = logp[0], old_logp[0]
            ref_logp = ref_logp[0] if ref_logp is not None else None
        T = self.totals(mask, extras) if totals is None else totals
        n_rows = T["rows"].to(logp).clamp_min(1.0)
        a = mask.to(logp.dtype)
        L = a.sum(-1).clamp_min(1.0)
        A = advantages.to(logp.dtype)[:, None]
        ratio = torch.exp(logp - old_logp)
        clipped = ratio.clamp(1 - self.eps, 1 + self.eps)
        obj = torch.minimum(ratio * A, clipped * A)
        policy = -((obj * a).sum(-1) / L).sum() / n_rows
        total = policy
        metrics: dict[str, float] = {"pg_loss": float(policy.detach())}
        if self.kl_coef > 0:
            if ref_logp is None:
                raise ValueError("kl_coef > 0 needs reference log-probabilities")
            # k3 = e^{ℓ_ref-ℓ} - (ℓ_ref-ℓ) - 1, finite for any gap (inactive positions included)
            kl = (kl_penalty(logp, ref_logp, A, "k3") * a).sum(-1).div(L).sum() / n_rows
            total = total + self.kl_coef * kl
            metrics["kl_loss"] = float(kl.detach())
        if self.self_distillation and extras is not None and "sd_weight" in extras:
            lam = float(extras["sd_lambda"][0]) if extras["sd_lambda"].numel() else 0.0
            if lam > 0:
                weight, logq = extras["sd_weight"].to(logp), extras["sd_logq"].to(logp)
                sd = (weight * (logq - logp)).sum() / T["sd_cells"].to(logp).clamp_min(1e-12)
                total = total + lam * sd
                metrics["sd_loss"] = float(sd.detach())
        with torch.no_grad():
            denom = a.sum() + 1e-8
            metrics["pg_clipfrac"] = float(
                (((ratio > 1 + self.eps) | (ratio < 1 - self.eps)).to(a.dtype) * a).sum() / denom
            )
            metrics["ppo_kl"] = float(((torch.exp(old_logp - logp) - (old_logp - logp) - 1) * a).sum() / denom)
            metrics["ratio_mean"] = float((ratio * a).sum() / denom) if a.sum() > 0 else 1.0
            metrics["ratio_max"] = float(ratio[a > 0].max()) if a.sum() > 0 else 1.0
        return total, metrics


def build(cfg: DTreeConfig, lookup) -> RLComponents:
    schedule = dict(
        max_steps=cfg.sd_max_steps,
        lambda_max=cfg.sd_lambda_max,
        gamma=cfg.sd_gamma,
        tau_max=cfg.sd_tau_max,
        beta=cfg.sd_beta,
    )

    return RLComponents(
        trajectory=lookup.trajectory(schedule=schedule),
        estimator=lookup.estimator(),
        loss=lookup.loss(clip_ratio=cfg.clip_ratio, kl_coef=cfg.kl_coef, self_distillation=cfg.self_distillation),
        needs_ref=cfg.kl_coef > 0,
    )


def tree_rollout(backend: Any, run_config: Any) -> TreeRollout:
    """``RolloutNeeds.wrap``: the run's training backend branched into d-TreeRPO's tree
    (``trainer.group_size`` leaves per prompt).

    Args:
        backend: the training rollout backend (it must offer ``continue_from``).
        run_config: the resolved run config (``algorithm`` is a :class:`DTreeConfig`).

    Returns:
        The tree rollout around ``backend``.
    """
    cfg = run_config.algorithm
    return TreeRollout(backend, cfg.tree_samples(run_config.trainer.group_size), cfg.branch_factor, cfg.contraction)
