"""The preference loop (DPO-style objectives on likelihood surrogates).

Data: (prompt, chosen, rejected) pairs from ``preference.train_path`` or generated from the
model's own rollouts on ``task.name`` (:mod:`dare_plugin_preference.pairs`). A training batch of
``N = trainer.batch_size`` pairs is one :class:`SequenceBatch` of ``2N`` rows in interleaved
order ``[c0, r0, c1, r1, ...]`` (row ``2i`` = prompt + chosen, row ``2i+1`` = prompt + rejected).

Per optimizer step:

1. the algorithm's corruption is drawn **once** for the ``2N`` rows;
2. the reference log-likelihoods are computed under exactly that corruption (the same
   timesteps and the same masked positions as the policy will see: shared, antithetic noise),
   without gradients;
3. one update (:func:`dare_core.api.update`, whole pairs per micro-batch): the loss's ``totals``
   (e.g. the number of pairs) of every micro-batch (``trainer.micro_batch_size`` rows, which must
   be even, so a chosen row never leaves its rejected partner) are summed over the micro-batches
   and ranks (one collective); for each micro-batch: estimator → loss normalised by those step
   totals → backward of ``loss · world_size`` (the engine averages gradients over ranks), so the
   gradient is the global batch's objective whatever the micro-batch size and the world size;
   clip → optimizer step.

The loss seam of this workflow is :class:`~dare_core.interfaces.PreferenceLoss`:
``loss.totals(batch)`` and ``loss(logp, ref_logp, batch, totals=...) -> (loss, metrics)``, where
``logp``/``ref_logp`` have the estimator's shape with the rows on dim 1 and ``batch`` is the
micro-batch (interleaved as above).

The reference policy is a frozen copy of the initial model; with fresh LoRA adapters it is the
same network with the adapters switched off (which equals the initial policy) and no copy is made.

Validation: the held-out pairs are scored before training, every ``eval.every`` steps and after
training under one fixed corruption (seeded by ``preference.eval_seed``), so before/after
numbers differ only through the weights. The loss's metrics (e.g. DPO loss, reward margin,
likelihood margin) are averaged over pairs. Task accuracy by generation is measured as in the
other workflows (``eval.before`` / ``eval.after``).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import attrs
import torch

from dare_core.api import (
    STREAM_CORRUPTION,
    STREAM_DATA,
    BatchStream,
    Context,
    DareError,
    Engine,
    ModelWrapper,
    PreferenceComponents,
    ReferencePolicy,
    SequenceBatch,
    Totals,
    Tracker,
    UpdateBatch,
    UpdatePlan,
    build_rollout,
    chunks,
    default_collate,
    encode_prompts,
    lr_at,
    update,
)
from dare_plugin_preference.config import SECTION, PreferenceConfig
from dare_plugin_preference.pairs import PreferencePair, generate_pairs, load_pairs, save_pairs


def collate_pairs(
    pairs: Sequence[PreferencePair],
    wrapper: Any,
    *,
    max_prompt_length: int,
    max_response_length: int,
    response_length: int = 0,
    pad_with_eos: bool = False,
) -> SequenceBatch:
    """``2N`` rows ``[c0, r0, c1, r1, ...]``: left-padded prompt, response + EOS right padded.

    Responses are ``encode(text) + [eos]`` cut to ``max_response_length``; padding uses the pad
    id with attention 0, or EOS with attention 1 when ``pad_with_eos``.
    """
    prompts = encode_prompts(wrapper, [_as_example(p) for p in pairs], max_prompt_length)
    eos = wrapper.eos_token_id
    p_rows, r_rows = [], []
    for p, ids in zip(pairs, prompts):
        for text in (p.chosen, p.rejected):
            p_rows.append(ids)
            r_rows.append((wrapper.encode(text) + [eos])[:max_response_length])
    fill = eos if pad_with_eos else None
    return default_collate(p_rows, r_rows, wrapper, response_length, fill, train_padding=pad_with_eos)


class _PromptOnly:
    def __init__(self, prompt):
        self.prompt = prompt


def _as_example(pair: PreferencePair) -> Any:
    return _PromptOnly(pair.prompt)


def pair_rows(pair_idx: torch.Tensor) -> torch.Tensor:
    """Row indices ``[2i, 2i+1, ...]`` of the pairs ``pair_idx`` in an interleaved batch."""
    return torch.stack([2 * pair_idx, 2 * pair_idx + 1], 1).reshape(-1)


def _section(config: Any) -> PreferenceConfig:
    return config.plugin_section(SECTION, PreferenceConfig)


def _generation_rollout(ctx: Context) -> Any:
    rc = ctx.config.rollout
    names = {f.name for f in attrs.fields(type(rc))}
    if "temperature" in names:
        rc = attrs.evolve(rc, temperature=_section(ctx.config).gen_temperature)
    return build_rollout(ctx.dare, ctx.config, rc)


def load_or_generate_pairs(ctx: Context) -> tuple[list[PreferencePair], list[PreferencePair], dict[str, Any]]:
    """Training and held-out pairs as ``preference.*`` says; generated pairs are written to
    ``<run>/pairs/{train,eval}.parquet`` (reuse them with ``preference.train_path=...``)."""
    cfg = ctx.config
    pc = _section(cfg)
    info: dict[str, Any] = {}
    rollout = None

    def generate(split: str, limit: int) -> list[PreferencePair]:
        nonlocal rollout
        rollout = rollout or _generation_rollout(ctx)
        examples = ctx.task.examples(split, limit=limit, seed=cfg.seed)
        ctx.log(f"generating preference pairs from {len(examples)} {split} prompts x {pc.gen_samples} rollouts ...")
        t0 = time.perf_counter()
        pairs, stats = generate_pairs(
            ctx.wrapper,
            rollout,
            ctx.task,
            examples,
            samples=pc.gen_samples,
            max_prompt_length=cfg.trainer.max_prompt_length,
            batch_size=cfg.eval.batch_size,
            generator=torch.Generator().manual_seed(cfg.seed + (11 if split == "train" else 13)),
            require_correct=pc.require_correct,
        )
        stats["seconds"] = round(time.perf_counter() - t0, 2)
        info[f"generated_{split}"] = stats
        ctx.log(f"{split}: {len(pairs)} pairs (rollout accuracy {stats['rollout_accuracy']:.3f}, {stats['seconds']} s)")
        if ctx.rundir is not None and ctx.engine.is_main:
            save_pairs(ctx.rundir.path("pairs", f"{split}.parquet"), pairs)
        return pairs

    if pc.train_path:
        train = load_pairs(pc.train_path)
        if pc.eval_path:
            held = load_pairs(pc.eval_path, limit=pc.num_eval) if pc.num_eval else []
        else:
            k = min(pc.num_eval, max(0, len(train) - 1))
            held, train = (train[len(train) - k :], train[: len(train) - k]) if k else ([], train)
    else:
        train = generate("train", pc.gen_prompts)
        if pc.eval_path:
            held = load_pairs(pc.eval_path, limit=pc.num_eval) if pc.num_eval else []
        else:
            held = generate("eval", pc.gen_eval_prompts)[: pc.num_eval] if pc.num_eval else []
    if not train:
        raise DareError(
            "no training preference pairs: every prompt's rollouts scored the same; raise "
            "preference.gen_samples or preference.gen_temperature, or pass preference.train_path"
        )
    info.update(train_pairs=len(train), eval_pairs=len(held))
    return train, held, info


@attrs.frozen
class PreferenceObjective:
    """The preference objective of some interleaved rows (the update step's objective): estimator
    over the rows' corruption → :class:`~dare_core.api.PreferenceLoss` against the reference
    log-likelihoods → backward through the engine."""

    components: PreferenceComponents
    wrapper: ModelWrapper
    engine: Engine

    def totals(self, part: UpdateBatch) -> Totals:
        """:meth:`PreferenceLoss.totals` of the rows (e.g. their pairs)."""
        return self.components.loss.totals(part.batch)

    def backward(self, part: UpdateBatch, totals: Totals, scale: float) -> tuple[torch.Tensor, dict[str, float]]:
        """``scale · ∇loss`` of the rows into the gradients; returns ``(detached loss, metrics)``."""
        comps = self.components
        with self.engine.autocast():
            logp = comps.estimator(self.wrapper, part.batch, part.corrupted)
            loss, metrics = comps.loss(logp, part.ref_logp, part.batch, totals=totals)
        self.engine.backward(loss * scale)
        return loss.detach(), metrics


def run_preference(ctx: Context) -> dict[str, Any]:
    cfg = ctx.config
    tr = cfg.trainer
    pc = _section(cfg)
    comps = ctx.bundle(PreferenceComponents)
    wrapper = ctx.wrapper
    device = wrapper.device
    if tr.micro_batch_size % 2:
        raise DareError(
            f"trainer.micro_batch_size={tr.micro_batch_size} must be even in the "
            f"preference workflow (a chosen row and its rejected row stay together)"
        )
    pairs_per_micro = tr.micro_batch_size // 2

    def collate(items: Sequence[PreferencePair]) -> SequenceBatch:
        return collate_pairs(
            items,
            wrapper,
            max_prompt_length=tr.max_prompt_length,
            max_response_length=tr.max_response_length,
            response_length=pc.response_length,
            pad_with_eos=pc.pad_with_eos,
        ).to(device)

    def corrupt(batch: SequenceBatch, generator: torch.Generator):
        return comps.corruption(wrapper, batch, generator) if comps.corruption is not None else None

    train_pairs, held_pairs, info = load_or_generate_pairs(ctx)
    engine = ctx.engine
    reference = ReferencePolicy(wrapper, engine)
    objective = PreferenceObjective(comps, wrapper, engine)

    # validation: one fixed corruption, reference values computed once
    held = None
    if held_pairs:
        h_batch = collate(held_pairs)
        h_corr = corrupt(h_batch, torch.Generator().manual_seed(pc.eval_seed))
        h_ref = reference.estimate(engine, comps.estimator, h_batch, h_corr, tr.micro_batch_size)
        held = (h_batch, h_corr, h_ref)

    batches = BatchStream(train_pairs, tr.batch_size, ctx.stream(STREAM_DATA))
    engine.setup_optimizer(wrapper, tr)
    tracker = Tracker(ctx, ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed), batches)

    def validate(label: str, step: int) -> Optional[dict[str, float]]:
        if held is None:
            return None
        h_batch, h_corr, h_ref = held
        n_pairs = h_batch.batch_size // 2
        was_training = wrapper.module.training
        wrapper.module.eval()
        agg: dict[str, float] = {}
        try:
            with torch.no_grad(), engine.autocast():
                for sl in chunks(n_pairs, pairs_per_micro):
                    rows = pair_rows(torch.arange(sl.start, sl.stop))
                    logp = comps.estimator(
                        wrapper, h_batch.select(rows), h_corr.select(rows) if h_corr is not None else None
                    )
                    _, metrics = comps.loss(logp, h_ref.index_select(1, rows.to(h_ref.device)), h_batch.select(rows))
                    for k, v in metrics.items():
                        agg[k] = agg.get(k, 0.0) + float(v) * (sl.stop - sl.start) / n_pairs
        finally:
            wrapper.module.train(was_training)
        agg["n_pairs"] = float(n_pairs)
        tracker.log({"step": step, "eval_pairs": agg})
        shown = " ".join(
            f"{k}={v:.4g}"
            for k, v in agg.items()
            if k in ("dpo_loss", "reward_margin", "reward_accuracy", "logp_margin")
        )
        ctx.log(f"held-out pairs {label}: {shown}")
        return agg

    if ctx.resume_from is None:
        before = validate("before", 0)
        if before is not None:
            tracker.summary["eval"]["pairs_before"] = before
    first = tracker.begin()

    wrapper.module.train()
    for step in range(first, tr.steps + 1):
        t0 = time.perf_counter()
        # each process trains on its pairs of the global batch, with a corruption stream keyed by
        # the step and its first pair's global position
        items = engine.shard(next(batches))
        batch = collate(items)
        n_pairs = len(items)
        corrupted = corrupt(batch, ctx.stream(STREAM_CORRUPTION, step, engine.rank * n_pairs))
        ref_logp = reference.estimate(engine, comps.estimator, batch, corrupted, tr.micro_batch_size)
        t_ref = time.perf_counter()
        lr = lr_at(tr, step - 1)
        plan = UpdatePlan(micro_batch=tr.micro_batch_size, unit=2, grad_clip=tr.grad_clip, lr=lr)
        stats = update(engine, objective, [UpdateBatch(batch, corrupted, ref_logp=ref_logp)], plan)
        record = {
            "step": step,
            "loss": stats.loss,
            "grad_norm": stats.grad_norm,
            "skipped_steps": stats.skipped_steps,
            "lr": lr,
            "pairs": n_pairs * engine.world_size,
            "time_ref": round(t_ref - t0, 3),
            "time_step": round(time.perf_counter() - t0, 3),
        }
        record.update(stats.metrics)
        tracker.step_end(step, record, loss=f"{stats.loss:.4f}")
        if cfg.eval.every and step % cfg.eval.every == 0 and step != tr.steps:
            validate(f"step-{step}", step)

    after = validate("after", tr.steps)
    if after is not None:
        tracker.summary["eval"]["pairs_after"] = after
    info.update(steps=tr.steps, final_loss_mean_last20=tracker.last("loss", 20))
    return tracker.finish(info)
