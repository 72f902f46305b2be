"""The one RL loop every RL algorithm runs.

Per step: sample prompts (sharded by rank, before group expansion so groups stay whole) → ``n``
rollouts per prompt → reward → advantage (the algorithm's estimator, group-normalised by default)
→ training input from the trajectory builder → corruption drawn **once** for the batch (once per
PPO epoch with ``Components.remask_each_epoch``) → old (and optional reference) log-likelihoods
under that same corruption → for each PPO epoch and mini-batch: estimator → policy loss →
backward over micro-batches → clip → optimizer step.
With one optimizer step per batch (``ppo_epochs=1``, no mini-batches) the old log-likelihoods
are the update's own forward, detached (``trainer.reuse_logprob``): one pass less, same values.
The loop calls component objects directly; pluggy is only used for the step-end observers.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

import attrs
import torch

from dare_core.components import FinalSequence, GroupNormAdvantage
from dare_core.components.losses import sum_totals
from dare_core.config.loader import backend_offers
from dare_core.engines.common import lr_at
from dare_core.engines.lockstep import lockstep
from dare_core.errors import DareError
from dare_core.interfaces import PolicyLoss, RolloutBatch, SequenceBatch
from dare_core.interfaces.rows import TrainingRows, TrajectoryContext
from dare_core.models import lora
from dare_core.workflows.batching import (
    STREAM_CORRUPTION, STREAM_DATA, STREAM_ORDER, STREAM_ROLLOUT, BatchStream, chunks, decode_responses,
    encode_prompts, left_pad)
from dare_core.workflows.checkpoint import push_policy
from dare_core.workflows.runtime import Context, build_rollout, eval_backend_name
from dare_core.workflows.tracker import Tracker


#: the console line of a step; with one update per batch the ratio is 1, so a ratio loss (one
#: reporting ``ratio_mean``) is ``-mean(A)`` and its clip fraction and KL(old‖new) are 0: left out
LINE = ("reward", "accuracy", "loss", "pg_clipfrac", "ppo_kl", "kl_loss", "grad_norm", "response_length",
        "rollout_tokens_per_s", "time_rollout", "time_update")


def estimate_no_grad(engine: Any, estimator: Any, wrapper: Any, batch, corrupted, micro: int) -> torch.Tensor:
    """``estimator`` over all rows in micro-batches of ``micro``, eval mode, no gradients, in the
    engine's compute precision; rows on dim 1."""
    outs = []
    was_training = wrapper.module.training
    wrapper.module.eval()
    try:
        with torch.no_grad(), engine.autocast():
            for sl in chunks(batch.batch_size, micro):
                idx = torch.arange(sl.start, sl.stop)
                outs.append(estimator(wrapper, batch.select(idx),
                                      corrupted.select(idx) if corrupted is not None else None))
    finally:
        wrapper.module.train(was_training)
    return torch.cat(outs, dim=1)


def _row_estimate(estimator: Any, wrapper: Any, batch, corrupted):
    """``estimate(rows)``: the estimator on the given Monte-Carlo rows of ``corrupted`` only."""
    return lambda rows: estimator(wrapper, batch, corrupted.select_samples(rows))


class ReferencePolicy:
    """The frozen reference policy of the KL term: under LoRA started from the base model, that
    base with the adapters disabled (no copy); otherwise the engine's frozen copy."""

    def __init__(self, wrapper: Any, engine: Any):
        self.policy = wrapper
        self.shared = lora.is_lora(wrapper) and lora.starts_from_base(wrapper)
        self.copy = None if self.shared else engine.reference(wrapper)

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        """The reference wrapper, valid inside the block."""
        if self.shared:
            with lora.adapters_disabled(self.policy) as w:
                yield w
        else:
            yield self.copy

    def estimate(self, engine: Any, estimator: Any, batch, corrupted, micro: int) -> torch.Tensor:
        """:func:`estimate_no_grad` under the reference policy."""
        with self.use() as w:
            return estimate_no_grad(engine, estimator, w, batch, corrupted, micro)


def run_rl(ctx: Context) -> dict[str, Any]:
    cfg = ctx.config
    tr = cfg.trainer
    comps = ctx.components
    wrapper = ctx.wrapper
    engine = ctx.engine

    train_examples = ctx.task.examples("train", seed=cfg.seed)
    eval_examples = ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
    batches = BatchStream(train_examples, tr.batch_size, ctx.stream(STREAM_DATA))
    trajectory = comps.trajectory or FinalSequence()
    advantage = comps.advantage or GroupNormAdvantage()
    _check_records(ctx, trajectory.records)
    require_totals(comps.loss, PolicyLoss, cfg.algo)
    base = training_backend(ctx)
    train_rollout = training_rollout(ctx, base)
    specs = ctx.dare.registries.rollouts
    synced = [(b, specs.get(name).sync) for b, name in ((base, cfg.rollout_backend),
              (ctx.eval_rollout, eval_backend_name(cfg))) if specs.get(name).sync]
    ref = ReferencePolicy(wrapper, engine) if comps.needs_ref else None
    engine.setup_optimizer(wrapper, tr)

    tracker = Tracker(ctx, eval_examples, batches)
    # engines outside this process start from the run's policy: before it is evaluated
    # (eval.before), or once a resumed run's state is restored
    for backend, how in synced if ctx.resume_from is None else ():
        push_policy(ctx, backend, how, 0)
    first = tracker.begin()
    for backend, how in synced if ctx.resume_from is not None else ():
        push_policy(ctx, backend, how, 0)
    for step in range(first, tr.steps + 1):
        t0 = time.perf_counter()
        c = collect(ctx, train_rollout, trajectory, advantage, next(batches), tr.group_size, step)
        rollout, rows, corrupted = c.rollout, c.rows, c.corrupted
        t_roll = t0 + c.rollout_seconds
        batch, advantages = rows.batch, rows.advantages.to(wrapper.device)
        total = batch.batch_size
        mini = max(1, tr.mini_batch_size // engine.world_size) if tr.mini_batch_size else total
        accumulating = comps.accumulate is not None and corrupted is not None
        # one optimizer step per batch: the policy that produced the rollouts is the one being
        # differentiated, so its log-likelihoods are the update's own forward, detached (a loss
        # that runs its own backward passes must say it can take old_logp=None)
        on_policy = (tr.reuse_logprob and tr.ppo_epochs == 1 and mini >= total
                     and (not accumulating or comps.accumulate.computes_own_old))
        draws = [corrupted] + [_corruption(ctx, batch, step, e) for e in range(1, tr.ppo_epochs)
                               if comps.remask_each_epoch and rows.corrupted is None and corrupted is not None]
        olds = [None if on_policy else estimate_no_grad(engine, comps.estimator, wrapper, batch, d,
                                                        tr.micro_batch_size) for d in draws]
        refs = [ref.estimate(engine, comps.estimator, batch, d, tr.micro_batch_size) if ref is not None
                else None for d in draws]
        t_old = time.perf_counter()

        wrapper.module.train()
        loss_sum, n_micro, n_mini = 0.0, 0, 0
        agg: dict[str, float] = {}
        norms, skipped = [], 0
        lr = lr_at(tr, step - 1)
        for epoch in range(tr.ppo_epochs):
            # one mini-batch of the whole batch needs no shuffle: rows keep their order, so the
            # micro-batches are the same rows on every world size
            perm = (torch.arange(total) if mini >= total and tr.ppo_epochs == 1 else
                    torch.randperm(total, generator=ctx.stream(STREAM_ORDER, step, epoch, engine.rank)))
            for msl in chunks(total, mini):
                k = epoch % len(draws)
                mb_loss, mb_micro = minibatch_backward(comps, wrapper, rows, draws[k], olds[k], refs[k],
                                                       advantages, perm[msl], tr.micro_batch_size, agg,
                                                       engine=engine)
                loss_sum += mb_loss
                n_micro += mb_micro
                n_mini += 1
                norm, ok = engine.step(tr.grad_clip, lr)
                norms.append(norm)
                skipped += 0 if ok else 1
        for backend, how in synced:  # and follow it
            push_policy(ctx, backend, how, step)
        t_end = time.perf_counter()

        # the batch's statistics over every rank's rollouts (group ids made global)
        merged = zip(c.rewards.tolist(), c.accs.tolist(),
                     (c.group_ids + engine.rank * len(c.group_ids)).tolist())
        rewards, accs, group_ids = (torch.tensor(v) for v in zip(*engine.gather(list(merged))))
        record = {
            "step": step, "reward": rewards.mean().item(), "accuracy": accs.mean().item(),
            "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            # this rank's shares times the world size: the ranks' mean is the mini-batch loss
            "loss": loss_sum * engine.world_size / max(1, n_mini), "grad_norm": sum(norms) / max(1, len(norms)),
            "skipped_steps": skipped, "lr": lr,
            "response_length": rollout.response_mask.float().sum(1).mean().item(),
            "rollout_nfe": sum(engine.gather([rollout.nfe])),  # forward calls of all ranks
            "time_rollout": round(t_roll - t0, 3), "time_logprob": round(t_old - t_roll, 3),
            "time_update": round(t_end - t_old, 3),
            "rollout_tokens_per_s": rollout.response_ids.numel() / max(1e-9, t_roll - t0),
        }
        record.update(_group_stats(ctx, rewards, group_ids))
        record.update({k: v / max(1, n_micro) for k, v in agg.items()})
        record.update(rows.metrics)
        ratio_one = tr.ppo_epochs == 1 and mini >= total and "ratio_mean" in record
        line = [k for k in LINE if not (ratio_one and k in ("loss", "pg_clipfrac", "ppo_kl"))]
        tracker.step_end(step, record, line, reward=f"{record['reward']:.3f}", acc=f"{record['accuracy']:.2f}")

    return tracker.finish({"steps": tr.steps, "final_reward_mean_last5": tracker.last("reward", 5)})


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


def training_backend(ctx: Context) -> Any:
    """The rollout backend RL trains with, unwrapped: the run's, as the algorithm adjusts it
    (``rollout_config``, e.g. one token per step left to right). Evaluation keeps the run's."""
    comps, cfg = ctx.components, ctx.config
    return (ctx.rollout if comps.rollout_config is None
            else build_rollout(ctx.dare, cfg, comps.rollout_config(cfg.rollout)))


def training_rollout(ctx: Context, backend: Any = None) -> Any:
    """:func:`training_backend` (or ``backend``) as the algorithm wraps it (``wrap_rollout``, e.g.
    branching the sampler into a tree of partial states)."""
    comps, cfg = ctx.components, ctx.config
    backend = training_backend(ctx) if backend is None else backend
    if comps.wrap_rollout is not None:
        backend = comps.wrap_rollout(backend, cfg)
    return backend


def collect(ctx: Context, rollout_backend: Any, trajectory: Any, advantage: Any, examples,
            group_size: int, step: int) -> Collected:
    """This rank's shard of the global batch ``examples``, rolled out ``group_size`` times each →
    rewards → advantages → training rows → the batch's one corruption draw (unless the rows bring
    their states). Prompts are padded to the global batch's longest, and each generate call (of
    ``trainer.rollout_batch_size`` prompts) and the corruption draw use streams keyed by global
    positions, so the rows do not depend on the number of processes."""
    wrapper, engine, tr = ctx.wrapper, ctx.engine, ctx.config.trainer
    t0 = time.perf_counter()
    prompts = encode_prompts(wrapper, examples, tr.max_prompt_length)
    mine = engine.shard(range(len(examples)))
    local = [examples[i] for i in mine]
    prompt_ids, prompt_mask = left_pad([prompts[i] for i in mine], wrapper.pad_token_id,
                                       max(len(p) for p in prompts))
    prompt_ids = prompt_ids.repeat_interleave(group_size, 0).to(wrapper.device)
    prompt_mask = prompt_mask.repeat_interleave(group_size, 0).to(wrapper.device)
    group_ids = torch.arange(len(local)).repeat_interleave(group_size)
    expanded = [ex for ex in local for _ in range(group_size)]
    chunk = (tr.rollout_batch_size or len(local)) * group_size
    if chunk < len(expanded) and trajectory.records:
        raise DareError(f"trainer.rollout_batch_size={tr.rollout_batch_size} splits the rollout, and "
                        f"the records algorithm {ctx.config.algo!r} needs ({', '.join(sorted(trajectory.records))}) "
                        f"are not joined across calls; set trainer.rollout_batch_size=0")
    parts = []
    for sl in chunks(len(expanded), chunk):
        gen = ctx.stream(STREAM_ROLLOUT, step, mine[0] * group_size + sl.start)
        with engine.autocast(), lockstep(engine, wrapper, prompt_ids[sl], prompt_mask[sl]):
            parts.append(rollout_backend.generate(wrapper, prompt_ids[sl], prompt_mask[sl],
                                                  record=trajectory.records, generator=gen))
    rollout = parts[0] if len(parts) == 1 else _join(parts)
    seconds = time.perf_counter() - t0
    texts = decode_responses(wrapper, rollout.response_ids.cpu(), rollout.response_mask.cpu())
    scored = [ctx.task.score(ex, text) for ex, text in zip(expanded, texts)]
    rewards = torch.tensor([_reward(ctx, s) for s in scored], dtype=torch.float32)
    accs = torch.tensor([s.acc for s in scored], dtype=torch.float32)
    advantages = advantage(rewards, group_ids).to(wrapper.device)
    rows = _training_rows(ctx, trajectory, rollout, rewards, advantages, group_ids, expanded, step)
    corrupted = rows.corrupted
    if corrupted is None and ctx.components.corruption is not None:
        corrupted = _corruption(ctx, rows.batch, step)
    return Collected(rollout, rewards, accs, group_ids, rows, corrupted, seconds)


def _join(parts: list[RolloutBatch]) -> RolloutBatch:
    """Rollouts of consecutive prompt chunks (no records) as one batch."""
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    return RolloutBatch(cat("prompt_ids"), cat("prompt_mask"), cat("response_ids"), cat("response_mask"),
                        num_steps=max(p.num_steps for p in parts), nfe=sum(p.nfe for p in parts))


def _corruption(ctx: Context, batch: SequenceBatch, *key: int) -> Any:
    """The corruption of this rank's rows (stream ``key``: the step, then the PPO epoch after the
    first), drawn over the global batch (every rank gathers the rows' ids and draws the same global
    corruption), so a corruption coupled across rows (e.g. stratified over the batch) and its random
    draws are those of one process. Rows whose shape differs between ranks are drawn per rank."""
    engine, corrupt = ctx.engine, ctx.components.corruption
    if engine.world_size == 1:
        return corrupt(ctx.wrapper, batch, ctx.stream(STREAM_CORRUPTION, *key))
    shapes = engine.gather([(tuple(batch.input_ids.shape), batch.prompt_len)])
    if len(set(shapes)) > 1:
        return corrupt(ctx.wrapper, batch, ctx.stream(STREAM_CORRUPTION, *key, engine.rank + 1))
    parts = engine.gather([(batch.input_ids.cpu(), batch.attention_mask.cpu())])
    full = SequenceBatch(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                         batch.prompt_len).to(batch.input_ids.device)
    n = batch.batch_size
    return corrupt(ctx.wrapper, full, ctx.stream(STREAM_CORRUPTION, *key)).select(
        torch.arange(engine.rank * n, (engine.rank + 1) * n))


def policy_backward(comps: Any, wrapper: Any, batch, corrupted, old, ref, advantages, mask,
                    scale: float, extras: Optional[dict] = None, *, engine: Any = None,
                    totals: Optional[dict] = None):
    """One micro-batch of the update: estimator → loss (normalised by the mini-batch's ``totals``;
    ``None``: these rows') → backward of ``scale · loss`` (through ``engine``'s backward and
    compute precision; ``None``: torch's), or the algorithm's ``Components.accumulate`` (one
    Monte-Carlo row at a time) when it has one and there is a corruption. ``old=None`` means the
    policy has not changed since the rollout: the old log-likelihoods are this forward's own,
    detached. Returns ``(detached loss, metrics)``."""
    backward = engine.backward if engine is not None else torch.Tensor.backward
    with engine.autocast() if engine is not None else contextlib.nullcontext():
        if comps.accumulate is not None and corrupted is not None:
            return comps.accumulate.accumulate(
                _row_estimate(comps.estimator, wrapper, batch, corrupted), corrupted.num_samples,
                old, ref, advantages, mask, scale, extras=extras, backward=backward, totals=totals)
        logp = comps.estimator(wrapper, batch, corrupted)
        loss, metrics = comps.loss(logp, logp.detach() if old is None else old, ref, advantages, mask,
                                   extras=extras, totals=totals)
    backward(loss * scale)
    return loss.detach(), metrics


def global_totals(engine: Any, parts: list[dict]) -> dict:
    """The sum of ``parts`` (:meth:`PolicyLoss.totals` of micro-batches) over them and over ranks
    (one gather when the engine has several), on the parts' device."""
    local = sum_totals(parts)
    if engine is None or engine.world_size == 1:
        return local
    device = next(iter(local.values())).device
    every = engine.gather([{k: v.cpu() for k, v in local.items()}])
    return {k: v.to(device) for k, v in sum_totals(every).items()}


def minibatch_backward(comps: Any, wrapper: Any, rows: TrainingRows, corrupted, old, ref_logp,
                       advantages, mb: torch.Tensor, micro_batch_size: int,
                       agg: dict[str, float], *, engine: Any = None) -> tuple[float, int]:
    """Accumulate the gradient of one mini-batch (this rank's rows ``mb``) in micro-batches of
    ``micro_batch_size``: every call is normalised by the mini-batch's totals (summed over its
    micro-batches and ranks) and its backward scaled by the world size (the engine averages
    gradients over ranks), so the gradient is the mini-batch objective's whatever the partition.
    Adds every micro-batch's metrics into ``agg``; returns this rank's share of the mini-batch
    loss and how many micro-batches ran."""
    parts = [mb[usl] for usl in chunks(len(mb), micro_batch_size)]
    extras = [rows.select_extras(idx) if rows.extras else None for idx in parts]
    totals = global_totals(engine, [comps.loss.totals(rows.select_weights(idx), ex)
                                    for idx, ex in zip(parts, extras)])
    world = engine.world_size if engine is not None else 1
    loss_sum = 0.0
    for idx, ex in zip(parts, extras):
        sub_corr = corrupted.select(idx) if corrupted is not None else None
        old_i = old.index_select(1, idx.to(old.device)) if old is not None else None
        ref_i = ref_logp.index_select(1, idx.to(ref_logp.device)) if ref_logp is not None else None
        loss, metrics = policy_backward(
            comps, wrapper, rows.batch.select(idx), sub_corr, old_i, ref_i,
            advantages[idx.to(advantages.device)], rows.select_weights(idx), float(world), ex,
            engine=engine, totals=totals)
        loss_sum += float(loss)
        for k, v in metrics.items():
            agg[k] = agg.get(k, 0.0) + float(v)
    return loss_sum, len(parts)


def require_totals(loss: Any, seam: type, algo: str) -> None:
    """Refuse, before any work, a loss without the ``totals`` method of its seam (``seam``)."""
    if not isinstance(loss, seam):
        raise DareError(f"the loss {type(loss).__name__} of algorithm {algo!r} has no method 'totals' "
                        f"({seam.__name__} seam), which the loops normalise by; implement it")


def _reward(ctx: Context, scored: Any) -> float:
    """The RL reward of a scored response: its score or its correctness (``task.reward``)."""
    return float(scored.acc if ctx.config.task.reward == "acc" else scored.score)


def _check_records(ctx: Context, records: frozenset) -> None:
    """Refuse, before any work, a rollout backend that cannot record what the trajectory needs or
    lacks the config fields and methods the algorithm's spec declares for its training rollout."""
    spec = ctx.dare.registries.rollouts.get(ctx.config.rollout_backend)
    algo = ctx.dare.registries.algorithms.get(ctx.config.algo)
    fields = {f.name for f in attrs.fields(spec.config_cls)}
    missing = sorted((records - set(spec.records)) | (algo.rollout_fields - fields)
                     | (algo.rollout_methods - set(spec.methods)))
    if missing:
        able = [n for n, s in ctx.dare.registries.rollouts.items()
                if backend_offers(s, records, algo.rollout_fields, algo.rollout_methods)
                and (not s.kinds or ctx.family.kind in s.kinds)]
        hint = f"set rollout.backend={able[0]}" if able else "no registered backend offers them"
        raise DareError(
            f"algorithm {ctx.config.algo!r} needs a rollout backend with {', '.join(missing)}, which "
            f"rollout backend {spec.name!r} does not offer; {hint}")


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


def _group_stats(ctx: Context, rewards: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """Fractions of groups whose rewards all reach the task's maximum (``solved_group_frac``: 1 under
    ``task.reward=acc``, else ``TaskSpec.max_score``; omitted where unknown) / are all equal."""
    groups = [rewards[group_ids == g] for g in group_ids.unique()]
    out = {"flat_group_frac": sum(bool((r == r[0]).all()) for r in groups) / len(groups)}
    task = ctx.config.task
    best = 1.0 if task.reward == "acc" else ctx.dare.registries.tasks.get(task.name).max_score
    if best is not None:
        out["solved_group_frac"] = sum(bool((r >= best).all()) for r in groups) / len(groups)
    return out
