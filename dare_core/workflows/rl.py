"""The one RL loop every RL algorithm runs: per step collect → update → report.

*Collect* (:func:`collect`): sample prompts (sharded by rank, before group expansion so groups
stay whole) → ``n`` rollouts per prompt → reward → advantage (the algorithm's estimator,
group-normalised by default) → training rows from the trajectory builder → corruption drawn
**once** for the batch (once per PPO epoch with ``RLComponents.remask_each_epoch``) → old (and
optional reference) log-likelihoods under that same corruption (:func:`update_batches`).
*Update* (:func:`dare_core.workflows.update.update`): for each PPO epoch and mini-batch,
estimator → policy loss → backward over micro-batches → clip → optimizer step. With one optimizer
step per batch (``ppo_epochs=1``, no mini-batches) the old log-likelihoods are the update's own
forward, detached (``trainer.reuse_logprob``): one pass less, same values. *Report*
(:func:`report`): the step's record. The loop calls component objects directly; pluggy is only
used for the step-end observers.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional, Sequence, cast

import attrs
import torch

from dare_core.config.loader import backend_offers
from dare_core.engines.common import lr_at
from dare_core.engines.lockstep import lockstep
from dare_core.errors import DareError
from dare_core.interfaces import (
    AdvantageEstimator,
    Corrupted,
    Engine,
    ForwardCorruption,
    ModelWrapper,
    RLComponents,
    RolloutBackend,
    RolloutBatch,
    SequenceBatch,
    Totals,
    TrajectoryBuilder,
    UpdateBatch,
)
from dare_core.interfaces.rows import ScoreFn, TrainingRows, TrajectoryContext
from dare_core.models import lora
from dare_core.workflows.batching import (
    STREAM_CORRUPTION,
    STREAM_DATA,
    STREAM_ORDER,
    STREAM_ROLLOUT,
    BatchStream,
    chunks,
    decode_responses,
    encode_prompts,
    left_pad,
)
from dare_core.workflows.checkpoint import push_policy
from dare_core.workflows.runtime import Context, eval_backend_name
from dare_core.workflows.tracker import Tracker
from dare_core.workflows.update import UpdatePlan, UpdateStats, update

#: the console line of a step (see :func:`_line` for the keys left out)
LINE = (
    "reward",
    "accuracy",
    "loss",
    "pg_clipfrac",
    "ppo_kl",
    "kl_loss",
    "grad_norm",
    "response_length",
    "rollout_tokens_per_s",
    "time_rollout",
    "time_update",
)


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
                outs.append(
                    estimator(wrapper, batch.select(idx), corrupted.select(idx) if corrupted is not None else None)
                )
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


@attrs.frozen
class RLSetup:
    """What :func:`run_rl` builds once before its steps."""

    batches: BatchStream
    trajectory: TrajectoryBuilder
    advantage: AdvantageEstimator
    rollout: RolloutBackend
    #: the backends outside this process and how the policy is pushed to them
    synced: Sequence[tuple[RolloutBackend, str]]
    reference: Optional[ReferencePolicy]
    objective: PolicyObjective
    tracker: Tracker


def run_rl(ctx: Context) -> dict[str, Any]:
    """The RL loop: per step collect → update → report (see the module docstring)."""
    tr = ctx.config.trainer
    run = _setup(ctx)
    first = _begin(ctx, run)
    for step in range(first, tr.steps + 1):
        t0 = time.perf_counter()
        c = collect(ctx, run.rollout, run.trajectory, run.advantage, next(run.batches), tr.group_size, step)
        plan = _plan(ctx, step, c.rows.num_rows)
        draws = update_batches(ctx, run.reference, c, step, _on_policy(ctx, plan, c))
        t_old = time.perf_counter()
        ctx.wrapper.module.train()
        stats = update(ctx.engine, run.objective, draws, plan)
        for backend, how in run.synced:  # and follow it
            push_policy(ctx, backend, how, step)
        times = {
            "time_rollout": c.rollout_seconds,
            "time_logprob": t_old - t0 - c.rollout_seconds,
            "time_update": time.perf_counter() - t_old,
        }
        record = report(ctx, c, stats, plan, step, times)
        line = _line(record, plan, c.rows.num_rows)
        run.tracker.step_end(step, record, line, reward=f"{record['reward']:.3f}", acc=f"{record['accuracy']:.2f}")
    return run.tracker.finish({"steps": tr.steps, "final_reward_mean_last5": run.tracker.last("reward", 5)})


def _setup(ctx: Context) -> RLSetup:
    """The run's data stream, components with their defaults, training rollout, synced backends,
    reference policy and optimizer; refuses, before any work, what the algorithm cannot run with."""
    cfg, comps = ctx.config, ctx.bundle(RLComponents)
    trajectory, advantage = comps.trajectory, comps.advantage
    assert trajectory is not None and advantage is not None, "setup fills the registry's defaults"
    train_examples = ctx.task.examples("train", seed=cfg.seed)
    eval_examples = ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
    batches = BatchStream(train_examples, cfg.trainer.batch_size, ctx.stream(STREAM_DATA))
    _check_records(ctx, trajectory.records)
    base = ctx.rollout
    specs = ctx.dare.registries.rollouts
    synced = [
        (b, specs.get(name).sync)
        for b, name in ((base, cfg.rollout_backend), (ctx.eval_rollout, eval_backend_name(cfg)))
        if specs.get(name).sync
    ]
    rollout = training_rollout(ctx)
    reference = ReferencePolicy(ctx.wrapper, ctx.engine) if comps.needs_ref else None
    ctx.engine.setup_optimizer(ctx.wrapper, cfg.trainer)
    return RLSetup(
        batches,
        trajectory,
        advantage,
        rollout,
        synced,
        reference,
        PolicyObjective(comps, ctx.wrapper, ctx.engine),
        Tracker(ctx, eval_examples, batches),
    )


def _begin(ctx: Context, run: RLSetup) -> int:
    """Start the tracker (evaluation before, or the resumed state); returns the first step.
    Engines outside this process start from the run's policy: before it is evaluated, or once a
    resumed run's state is restored."""
    resuming = ctx.resume_from is not None
    for backend, how in run.synced if not resuming else ():
        push_policy(ctx, backend, how, 0)
    first = run.tracker.begin()
    for backend, how in run.synced if resuming else ():
        push_policy(ctx, backend, how, 0)
    return first


def _plan(ctx: Context, step: int, total: int) -> UpdatePlan:
    """The step's walk over this rank's ``total`` rows: PPO epochs, this rank's share of
    ``trainer.mini_batch_size``, micro-batches; one mini-batch of the whole batch in one epoch keeps
    the rows' order (the micro-batches are the same rows on every world size), else each epoch
    shuffles by its stream."""
    tr, engine = ctx.config.trainer, ctx.engine
    mini = max(1, tr.mini_batch_size // engine.world_size) if tr.mini_batch_size else total
    in_order = mini >= total and tr.ppo_epochs == 1
    order = None if in_order else (lambda epoch: ctx.stream(STREAM_ORDER, step, epoch, engine.rank))
    return UpdatePlan(
        micro_batch=tr.micro_batch_size,
        mini_batch=min(mini, total),
        epochs=tr.ppo_epochs,
        grad_clip=tr.grad_clip,
        lr=lr_at(tr, step - 1),
        order=order,
    )


def _on_policy(ctx: Context, plan: UpdatePlan, c: Collected) -> bool:
    """One optimizer step per batch (``trainer.reuse_logprob``): the policy that produced the
    rollouts is the one being differentiated, so its log-likelihoods are the update's own forward,
    detached (a loss that runs its own backward passes must say it can take ``old_logp=None``)."""
    accumulate = ctx.bundle(RLComponents).accumulate
    return (
        ctx.config.trainer.reuse_logprob
        and plan.epochs == 1
        and plan.mini_batch >= c.rows.num_rows
        and (accumulate is None or c.corrupted is None or accumulate.computes_own_old)
    )


def update_batches(
    ctx: Context, reference: Optional[ReferencePolicy], c: Collected, step: int, on_policy: bool
) -> list[UpdateBatch]:
    """The collected rows under each corruption draw (the batch's, plus one per further PPO epoch
    with ``RLComponents.remask_each_epoch``), with their old (unless ``on_policy``) and reference
    log-likelihoods, all computed before the first update."""
    comps, rows, micro = ctx.bundle(RLComponents), c.rows, ctx.config.trainer.micro_batch_size
    batch = rows.batch
    fresh = comps.remask_each_epoch and rows.corrupted is None and c.corrupted is not None
    draws = [c.corrupted] + [_corruption(ctx, batch, step, e) for e in range(1, ctx.config.trainer.ppo_epochs) if fresh]
    out = []
    for d in draws:
        old = None if on_policy else estimate_no_grad(ctx.engine, comps.estimator, ctx.wrapper, batch, d, micro)
        ref = reference.estimate(ctx.engine, comps.estimator, batch, d, micro) if reference is not None else None
        out.append(rows_update_batch(rows, d, old, ref))
    return out


def rows_update_batch(
    rows: TrainingRows,
    corrupted: Optional[Corrupted],
    old_logp: Optional[torch.Tensor] = None,
    ref_logp: Optional[torch.Tensor] = None,
) -> UpdateBatch:
    """The trajectory builder's training rows as the update's rows: advantages on the batch's device,
    the loss weights (``TrainingRows.weights`` or the response mask) and extras, under ``corrupted``."""
    return UpdateBatch(
        rows.batch,
        corrupted,
        old_logp,
        ref_logp,
        rows.advantages.to(rows.batch.input_ids.device),
        rows.loss_weights(),
        dict(rows.extras),
    )


def report(
    ctx: Context, c: Collected, stats: UpdateStats, plan: UpdatePlan, step: int, times: dict[str, float]
) -> dict[str, Any]:
    """The step's record: the batch's statistics over every rank's rollouts (group ids made
    global), the update's statistics and the builder's metrics."""
    engine, rollout = ctx.engine, c.rollout
    merged = zip(c.rewards.tolist(), c.accs.tolist(), (c.group_ids + engine.rank * len(c.group_ids)).tolist())
    rewards, accs, group_ids = (torch.tensor(v) for v in zip(*engine.gather(list(merged))))
    record = {
        "step": step,
        "reward": rewards.mean().item(),
        "accuracy": accs.mean().item(),
        "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "skipped_steps": stats.skipped_steps,
        "lr": plan.lr,
        "response_length": rollout.response_mask.float().sum(1).mean().item(),
        "rollout_nfe": sum(engine.gather([rollout.nfe])),  # forward calls of all ranks
        **{k: round(v, 3) for k, v in times.items()},
        "rollout_tokens_per_s": rollout.response_ids.numel() / max(1e-9, times["time_rollout"]),
    }
    record.update(_group_stats(ctx, rewards, group_ids))
    record.update(stats.metrics)
    record.update(c.rows.metrics)
    return record


def _line(record: dict[str, Any], plan: UpdatePlan, total: int) -> list[str]:
    """The console keys of a step; with one update per batch the ratio is 1, so a ratio loss (one
    reporting ``ratio_mean``) is ``-mean(A)`` and its clip fraction and KL(old‖new) are 0: left out."""
    ratio_one = plan.epochs == 1 and plan.mini_batch >= total and "ratio_mean" in record
    return [k for k in LINE if not (ratio_one and k in ("loss", "pg_clipfrac", "ppo_kl"))]


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


def training_rollout(ctx: Context) -> RolloutBackend:
    """The rollout backend RL trains with: the run's training backend (built once on
    ``RunConfig.train_rollout``) as the algorithm wraps it (``RolloutNeeds.wrap``, e.g. branching
    the sampler into a tree of partial states)."""
    wrap = ctx.spec.rollout.wrap
    return ctx.rollout if wrap is None else wrap(ctx.rollout, ctx.config)


def collect(
    ctx: Context, rollout_backend: Any, trajectory: Any, advantage: Any, examples, group_size: int, step: int
) -> Collected:
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
    prompt_ids, prompt_mask = left_pad([prompts[i] for i in mine], wrapper.pad_token_id, max(len(p) for p in prompts))
    prompt_ids = prompt_ids.repeat_interleave(group_size, 0).to(wrapper.device)
    prompt_mask = prompt_mask.repeat_interleave(group_size, 0).to(wrapper.device)
    group_ids = torch.arange(len(local)).repeat_interleave(group_size)
    expanded = [ex for ex in local for _ in range(group_size)]
    chunk = (tr.rollout_batch_size or len(local)) * group_size
    if chunk < len(expanded) and trajectory.records:
        raise DareError(
            f"trainer.rollout_batch_size={tr.rollout_batch_size} splits the rollout, and "
            f"the records algorithm {ctx.config.algo!r} needs ({', '.join(sorted(trajectory.records))}) "
            f"are not joined across calls; set trainer.rollout_batch_size=0"
        )
    parts = []
    for sl in chunks(len(expanded), chunk):
        gen = ctx.stream(STREAM_ROLLOUT, step, mine[0] * group_size + sl.start)
        with engine.autocast(), lockstep(engine, wrapper, prompt_ids[sl], prompt_mask[sl]):
            parts.append(
                rollout_backend.generate(
                    wrapper, prompt_ids[sl], prompt_mask[sl], record=trajectory.records, generator=gen
                )
            )
    rollout = parts[0] if len(parts) == 1 else _join(parts)
    seconds = time.perf_counter() - t0
    texts = decode_responses(wrapper, rollout.response_ids.cpu(), rollout.response_mask.cpu())
    scored = [ctx.task.score(ex, text) for ex, text in zip(expanded, texts)]
    rewards = torch.tensor([_reward(ctx, s) for s in scored], dtype=torch.float32)
    accs = torch.tensor([s.acc for s in scored], dtype=torch.float32)
    advantages = advantage(rewards, group_ids).to(wrapper.device)
    context = TrajectoryContext(
        rewards, advantages, group_ids, _score_fn(ctx, expanded), step, ctx.config.trainer.steps, ctx.generator
    )
    rows = trajectory.rows(ctx.wrapper, rollout, context)  # see dare_core.interfaces.rows
    corrupted = rows.corrupted
    if corrupted is None and ctx.components.corruption is not None:
        corrupted = _corruption(ctx, rows.batch, step)
    return Collected(rollout, rewards, accs, group_ids, rows, corrupted, seconds)


def _join(parts: list[RolloutBatch]) -> RolloutBatch:
    """Rollouts of consecutive prompt chunks (no records) as one batch."""
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    return RolloutBatch(
        cat("prompt_ids"),
        cat("prompt_mask"),
        cat("response_ids"),
        cat("response_mask"),
        num_steps=max(p.num_steps for p in parts),
        nfe=sum(p.nfe for p in parts),
    )


def _corruption(ctx: Context, batch: SequenceBatch, *key: int) -> Corrupted:
    """The corruption of this rank's rows (stream ``key``: the step, then the PPO epoch after the
    first), drawn over the global batch (every rank gathers the rows' ids and draws the same global
    corruption), so a corruption coupled across rows (e.g. stratified over the batch) and its random
    draws are those of one process. Rows whose shape differs between ranks are drawn per rank."""
    # called only for an algorithm with a corruption (its callers check Components.corruption)
    engine, corrupt = ctx.engine, cast(ForwardCorruption, ctx.components.corruption)
    if engine.world_size == 1:
        return corrupt(ctx.wrapper, batch, ctx.stream(STREAM_CORRUPTION, *key))
    shapes = engine.gather([(tuple(batch.input_ids.shape), batch.prompt_len)])
    if len(set(shapes)) > 1:
        return corrupt(ctx.wrapper, batch, ctx.stream(STREAM_CORRUPTION, *key, engine.rank + 1))
    parts = engine.gather([(batch.input_ids.cpu(), batch.attention_mask.cpu())])
    full = SequenceBatch(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), batch.prompt_len).to(
        batch.input_ids.device
    )
    n = batch.batch_size
    return corrupt(ctx.wrapper, full, ctx.stream(STREAM_CORRUPTION, *key)).select(
        torch.arange(engine.rank * n, (engine.rank + 1) * n)
    )


@attrs.frozen
class PolicyObjective:
    """The RL objective of some rows (:class:`~dare_core.workflows.update.UpdateObjective`):
    estimator → policy loss → backward, or the algorithm's ``RLComponents.accumulate`` (one
    Monte-Carlo row at a time) when it has one and the rows have a corruption. ``engine``: its
    backward and compute precision (``None``: torch's)."""

    components: RLComponents
    wrapper: ModelWrapper
    engine: Optional[Engine] = None

    def totals(self, part: UpdateBatch) -> Totals:
        """:meth:`PolicyLoss.totals` of the rows' weights and extras."""
        return self.components.loss.totals(
            cast(torch.Tensor, part.weights), part.extras or None
        )  # RL rows carry weights

    def backward(self, part: UpdateBatch, totals: Totals, scale: float) -> tuple[torch.Tensor, dict[str, float]]:
        """``scale · ∇loss`` of the rows into the gradients; ``part.old_logp=None``: the old
        log-likelihoods are this forward's own, detached. Returns ``(detached loss, metrics)``."""
        comps, engine = self.components, self.engine
        backward = engine.backward if engine is not None else torch.Tensor.backward
        extras = part.extras or None
        # RL rows (rows_update_batch) carry advantages and weights
        advantages, weights = cast(torch.Tensor, part.advantages), cast(torch.Tensor, part.weights)
        with engine.autocast() if engine is not None else contextlib.nullcontext():
            if comps.accumulate is not None and part.corrupted is not None:
                return comps.accumulate.accumulate(
                    _row_estimate(comps.estimator, self.wrapper, part.batch, part.corrupted),
                    part.corrupted.num_samples,
                    part.old_logp,
                    part.ref_logp,
                    advantages,
                    weights,
                    scale,
                    extras=extras,
                    backward=backward,
                    totals=totals,
                )
            logp = comps.estimator(self.wrapper, part.batch, part.corrupted)
            old = logp.detach() if part.old_logp is None else part.old_logp
            loss, metrics = comps.loss(logp, old, part.ref_logp, advantages, weights, extras=extras, totals=totals)
        backward(loss * scale)
        return loss.detach(), metrics


def _reward(ctx: Context, scored: Any) -> float:
    """The RL reward of a scored response: its score or its correctness (``task.reward``)."""
    return float(scored.acc if ctx.config.task.reward == "acc" else scored.score)


def _check_records(ctx: Context, records: frozenset) -> None:
    """Refuse, before any work, a rollout backend that cannot record what the trajectory needs or
    lacks the config fields and methods the algorithm's spec declares for its training rollout."""
    spec = ctx.dare.registries.rollouts.get(ctx.config.rollout_backend)
    algo = ctx.dare.registries.algorithms.get(ctx.config.algo)
    needs = algo.rollout
    fields = {f.name for f in attrs.fields(spec.config_cls)}
    missing = sorted((records - set(spec.records)) | (needs.fields - fields) | (needs.methods - set(spec.methods)))
    if missing:
        able = [
            n
            for n, s in ctx.dare.registries.rollouts.items()
            if backend_offers(s, records, needs.fields, needs.methods) and (not s.kinds or ctx.family.kind in s.kinds)
        ]
        hint = f"set rollout.backend={able[0]}" if able else "no registered backend offers them"
        raise DareError(
            f"algorithm {ctx.config.algo!r} needs a rollout backend with {', '.join(missing)}, which "
            f"rollout backend {spec.name!r} does not offer; {hint}"
        )


def _score_fn(ctx: Context, expanded: list) -> ScoreFn:
    """The task reward of any responses, each against the example of its rollout row."""

    def score(response_ids: torch.Tensor, response_mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        texts = decode_responses(ctx.wrapper, response_ids.cpu(), response_mask.cpu())
        return torch.tensor(
            [_reward(ctx, ctx.task.score(expanded[int(r)], t)) for r, t in zip(rows.tolist(), texts)],
            dtype=torch.float32,
        )

    return score


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
