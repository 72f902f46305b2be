"""The one RL loop every RL algorithm runs.

Per step: sample prompts (sharded by rank, before group expansion so groups stay whole) → ``n``
rollouts per prompt → reward → advantage (the algorithm's estimator, group-normalised by default)
→ training input from the trajectory builder → corruption drawn **once** for the batch → old (and
optional reference) log-likelihoods under that same corruption → for each PPO epoch and
mini-batch: estimator → policy loss → backward over micro-batches → clip → optimizer step.
With one optimizer step per batch (``ppo_epochs=1``, no mini-batches) the old log-likelihoods
are the update's own forward, detached (``trainer.reuse_logprob``): one pass less, same values.
The loop calls component objects directly; pluggy is only used for the step-end observers.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Optional

import attrs
import torch

from dare_core.components import FinalSequence, GroupNormAdvantage
from dare_core.interfaces.rows import TrainingRows, TrajectoryContext
from dare_core.errors import DareError
from dare_core.workflows.runtime import Context, build_rollout
from dare_core.workflows.batching import (
    chunks,
    cycle_batches,
    decode_responses,
    encode_prompts,
    left_pad,
)
from dare_core.workflows.optim import clip_and_step, make_optimizer
from dare_core.workflows.tracker import Tracker


def _estimate(ctx: Context, wrapper: Any, batch, corrupted, micro: int) -> torch.Tensor:
    """Estimator over the whole batch in micro-batches, without gradients; dim 1 is the batch."""
    est = ctx.components.estimator
    outs = []
    was_training = wrapper.module.training
    wrapper.module.eval()
    try:
        with torch.no_grad():
            for sl in chunks(batch.batch_size, micro):
                idx = torch.arange(sl.start, sl.stop)
                outs.append(est(wrapper, batch.select(idx),
                                corrupted.select(idx) if corrupted is not None else None))
    finally:
        wrapper.module.train(was_training)
    return torch.cat(outs, dim=1)


def _row_estimate(estimator: Any, wrapper: Any, batch, corrupted):
    """``estimate(rows)``: the estimator on the given Monte-Carlo rows of ``corrupted`` only."""

    def estimate(rows):
        return estimator(wrapper, batch, corrupted.select_samples(rows))

    return estimate


class _RefWrapper:
    """A frozen copy of the policy used for reference log-likelihoods."""

    def __init__(self, wrapper: Any):
        self._w = copy.copy(wrapper)
        self._w.module = copy.deepcopy(wrapper.module).eval()
        for p in self._w.module.parameters():
            p.requires_grad_(False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)


def run_rl(ctx: Context) -> dict[str, Any]:
    cfg = ctx.config
    tr = cfg.trainer
    comps = ctx.components
    wrapper = ctx.wrapper
    device = wrapper.device
    gen = ctx.generator

    train_examples = ctx.engine.shard(ctx.task.examples("train", seed=cfg.seed))
    eval_examples = ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
    batches = cycle_batches(train_examples, tr.batch_size, gen)
    trajectory = comps.trajectory or FinalSequence()
    advantage = comps.advantage or GroupNormAdvantage()
    _check_records(ctx, trajectory.records)
    train_rollout = training_rollout(ctx)
    ref = _RefWrapper(wrapper) if comps.needs_ref else None
    params = list(wrapper.module.parameters())
    optimizer, scheduler = make_optimizer(params, cfg)

    tracker = Tracker(ctx, eval_examples)
    tracker.begin()
    history = []
    for step in range(1, tr.steps + 1):
        t0 = time.perf_counter()
        c = collect(ctx, train_rollout, trajectory, advantage, next(batches), tr.group_size, step)
        rollout, rewards, accs, group_ids, rows, corrupted = (
            c.rollout, c.rewards, c.accs, c.group_ids, c.rows, c.corrupted)
        t_roll = t0 + c.rollout_seconds
        batch, advantages = rows.batch, rows.advantages.to(device)
        total = batch.batch_size
        mini = tr.mini_batch_size or total
        accumulating = comps.accumulate is not None and corrupted is not None
        # one optimizer step per batch: the policy that produced the rollouts is the one being
        # differentiated, so its log-likelihoods are the update's own forward, detached (a loss
        # that runs its own backward passes must say it can take old_logp=None)
        on_policy = (tr.reuse_logprob and tr.ppo_epochs == 1 and mini >= total
                     and (not accumulating or comps.accumulate.computes_own_old))
        old = None if on_policy else _estimate(ctx, wrapper, batch, corrupted, tr.micro_batch_size)
        ref_logp = _estimate(ctx, ref, batch, corrupted, tr.micro_batch_size) if ref is not None else None
        t_old = time.perf_counter()

        wrapper.module.train()
        loss_sum, n_micro = 0.0, 0
        agg: dict[str, float] = {}
        norms, skipped = [], 0
        for _epoch in range(tr.ppo_epochs):
            perm = torch.randperm(total, generator=gen)
            for msl in chunks(total, mini):
                mb_loss, mb_micro = minibatch_backward(comps, wrapper, rows, corrupted, old, ref_logp,
                                                       advantages, perm[msl], tr.micro_batch_size, agg)
                loss_sum += mb_loss
                n_micro += mb_micro
                norm, ok = clip_and_step(params, optimizer, tr.grad_clip)
                norms.append(norm)
                skipped += 0 if ok else 1
        scheduler.step()
        t_end = time.perf_counter()

        resp_len = rollout.response_mask.float().sum(1).mean().item()
        record = {
            "step": step,
            "reward": rewards.mean().item(),
            "accuracy": accs.mean().item(),
            "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "loss": loss_sum / max(1, n_micro),
            "grad_norm": sum(norms) / max(1, len(norms)),
            "skipped_steps": skipped,
            "lr": scheduler.get_last_lr()[0],
            "response_length": resp_len,
            "rollout_nfe": rollout.nfe,
            "time_rollout": round(t_roll - t0, 3),
            "time_logprob": round(t_old - t_roll, 3),
            "time_update": round(t_end - t_old, 3),
            "rollout_tokens_per_s": rollout.response_ids.numel() / max(1e-9, t_roll - t0),
        }
        record["solved_group_frac"], record["flat_group_frac"] = _group_stats(rewards, group_ids)
        record.update({k: v / max(1, n_micro) for k, v in agg.items()})
        record.update(rows.metrics)
        record = tracker.step_end(step, record, reward=f"{record['reward']:.3f}",
                                  acc=f"{record['accuracy']:.2f}")
        history.append(record)

    last = history[-5:]
    return tracker.finish({
        "steps": tr.steps,
        "final_reward_mean_last5": sum(r["reward"] for r in last) / max(1, len(last)),
    })


@attrs.frozen
class Collected:
    """One rollout batch made ready for the update (:func:`collect`)."""

    rollout: Any
    rewards: torch.Tensor
    accs: torch.Tensor
    group_ids: torch.Tensor
    rows: TrainingRows
    corrupted: Any
    rollout_seconds: float


def training_rollout(ctx: Context) -> Any:
    """The rollout backend RL trains with: the run's, as the algorithm adjusts it
    (``rollout_config``, e.g. one token per step left to right) and wraps it (``wrap_rollout``,
    e.g. branching the sampler into a tree of partial states). Evaluation keeps the run's."""
    comps, cfg = ctx.components, ctx.config
    backend = (ctx.rollout if comps.rollout_config is None
               else build_rollout(ctx.dare, cfg, comps.rollout_config(cfg.rollout)))
    if comps.wrap_rollout is not None:
        backend = comps.wrap_rollout(backend, cfg)
    return backend


def collect(ctx: Context, rollout_backend: Any, trajectory: Any, advantage: Any, examples,
            group_size: int, step: int) -> Collected:
    """``group_size`` rollouts of each example → rewards (``task.reward``) → advantages →
    training rows → the one corruption draw of the batch (unless the rows bring their states)."""
    wrapper = ctx.wrapper
    t0 = time.perf_counter()
    prompts = encode_prompts(wrapper, examples, ctx.config.trainer.max_prompt_length)
    prompt_ids, prompt_mask = left_pad(prompts, wrapper.pad_token_id)
    prompt_ids = prompt_ids.repeat_interleave(group_size, 0).to(wrapper.device)
    prompt_mask = prompt_mask.repeat_interleave(group_size, 0).to(wrapper.device)
    group_ids = torch.arange(len(examples)).repeat_interleave(group_size)
    expanded = [ex for ex in examples for _ in range(group_size)]
    rollout = rollout_backend.generate(wrapper, prompt_ids, prompt_mask, record=trajectory.records,
                                       generator=ctx.generator)
    seconds = time.perf_counter() - t0
    texts = decode_responses(wrapper, rollout.response_ids.cpu(), rollout.response_mask.cpu())
    scored = [ctx.task.score(ex, text) for ex, text in zip(expanded, texts)]
    rewards = torch.tensor([_reward(ctx, s) for s in scored], dtype=torch.float32)
    accs = torch.tensor([s.acc for s in scored], dtype=torch.float32)
    advantages = advantage(rewards, group_ids).to(wrapper.device)
    rows = _training_rows(ctx, trajectory, rollout, rewards, advantages, group_ids, expanded, step)
    corrupted = rows.corrupted
    if corrupted is None and ctx.components.corruption is not None:
        corrupted = ctx.components.corruption(wrapper, rows.batch, ctx.generator)
    return Collected(rollout, rewards, accs, group_ids, rows, corrupted, seconds)


def policy_backward(comps: Any, wrapper: Any, batch, corrupted, old, ref, advantages, mask,
                    scale: float, extras: Optional[dict] = None):
    """One micro-batch of the update: estimator → loss → ``backward`` of ``scale · loss``, or the
    algorithm's ``Components.accumulate`` (one Monte-Carlo row at a time) when it has one and there
    is a corruption. ``old=None`` means the policy has not changed since the rollout: the old
    log-likelihoods are this forward's own, detached. Returns ``(detached loss, metrics)``."""
    if comps.accumulate is not None and corrupted is not None:
        return comps.accumulate.accumulate(_row_estimate(comps.estimator, wrapper, batch, corrupted),
                                           corrupted.num_samples, old, ref, advantages, mask, scale,
                                           extras=extras)
    logp = comps.estimator(wrapper, batch, corrupted)
    loss, metrics = comps.loss(logp, logp.detach() if old is None else old, ref, advantages, mask,
                               extras=extras)
    (loss * scale).backward()
    return loss.detach(), metrics


def minibatch_backward(comps: Any, wrapper: Any, rows: TrainingRows, corrupted, old, ref_logp,
                       advantages, mb: torch.Tensor, micro_batch_size: int,
                       agg: dict[str, float]) -> tuple[float, int]:
    """Accumulate the gradient of one mini-batch (the rows ``mb``) in micro-batches of
    ``micro_batch_size``, each scaled by its share of the mini-batch, so the sum is the
    mini-batch's mean-loss gradient. Adds every micro-batch's metrics into ``agg``; returns the
    summed micro-batch losses and how many micro-batches ran."""
    loss_sum, n_micro = 0.0, 0
    for usl in chunks(len(mb), micro_batch_size):
        idx = mb[usl]
        sub_corr = corrupted.select(idx) if corrupted is not None else None
        old_i = old.index_select(1, idx.to(old.device)) if old is not None else None
        ref_i = ref_logp.index_select(1, idx.to(ref_logp.device)) if ref_logp is not None else None
        loss, metrics = policy_backward(
            comps, wrapper, rows.batch.select(idx), sub_corr, old_i, ref_i,
            advantages[idx.to(advantages.device)], rows.select_weights(idx), len(idx) / len(mb),
            rows.select_extras(idx) if rows.extras else None)
        loss_sum += float(loss)
        n_micro += 1
        for k, v in metrics.items():
            agg[k] = agg.get(k, 0.0) + float(v)
    return loss_sum, n_micro


def _reward(ctx: Context, scored: Any) -> float:
    """The RL reward of one scored response: the task's score or its exact correctness
    (``task.reward``)."""
    return float(scored.acc if ctx.config.task.reward == "acc" else scored.score)


def _check_records(ctx: Context, records: frozenset) -> None:
    """Refuse, before any work, a rollout backend that cannot record what the trajectory needs."""
    spec = ctx.dare.registries.rollouts.get(ctx.config.rollout_backend)
    missing = sorted(records - set(spec.records))
    if missing:
        able = [n for n, s in ctx.dare.registries.rollouts.items()
                if records <= set(s.records) and (not s.kinds or ctx.family.kind in s.kinds)]
        hint = f"set rollout.backend={able[0]}" if able else "no registered backend records it"
        raise DareError(
            f"algorithm {ctx.config.algo!r} needs the rollout to record {', '.join(missing)}, which "
            f"rollout backend {spec.name!r} does not; {hint}")


def _training_rows(ctx: Context, trajectory: Any, rollout, rewards, advantages, group_ids,
                   expanded, step: int) -> TrainingRows:
    """The builder's training rows (:meth:`TrajectoryBuilder.rows`: the final sequence, or several
    rows per rollout, replayed states, token weights; see :mod:`dare_core.interfaces.rows`)."""

    def score(response_ids: torch.Tensor, response_mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        texts = decode_responses(ctx.wrapper, response_ids.cpu(), response_mask.cpu())
        return torch.tensor([_reward(ctx, ctx.task.score(expanded[int(r)], t))
                             for r, t in zip(rows.tolist(), texts)], dtype=torch.float32)

    context = TrajectoryContext(rewards, advantages, group_ids, score, step,
                                ctx.config.trainer.steps, ctx.generator)
    return trajectory.rows(ctx.wrapper, rollout, context)


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[float, float]:
    """Fractions of groups whose rewards are all maximal / all equal (no learning signal)."""
    groups = group_ids.unique()
    top = rewards.max()
    solved = flat = 0
    for g in groups:
        r = rewards[group_ids == g]
        flat += int(bool((r == r[0]).all()))
        solved += int(bool((r == top).all()))
    return solved / len(groups), flat / len(groups)
