"""The supervised loop (SFT and any objective over reference responses).

Per optimizer step: ``batch_size`` (prompt, response) pairs (the global batch; each process
trains on its rows) → the algorithm's collate → corruption, drawn once over the global batch →
one update (:func:`dare_core.workflows.update.update`): for each micro-batch, estimator →
objective, normalised by the step's totals (:meth:`SFTObjective.totals` summed over the
micro-batches and ranks) → backward scaled by the world size (the engine averages over
processes), so the gradient is the global batch's whatever the partition → clip → step.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Optional, Sequence

import attrs
import torch

from dare_core.engines.common import lr_at
from dare_core.errors import DareError
from dare_core.interfaces import Engine, ModelWrapper, SequenceBatch, SFTComponents, Totals, UpdateBatch
from dare_core.workflows.batching import STREAM_CORRUPTION, STREAM_DATA, BatchStream, encode_prompts, left_pad
from dare_core.workflows.runtime import Context
from dare_core.workflows.tracker import Tracker
from dare_core.workflows.update import UpdatePlan, update


def default_collate(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    wrapper: Any,
    response_length: int = 0,
    fill_id: Optional[int] = None,
    train_padding: bool = False,
) -> SequenceBatch:
    """Left-padded prompts and right-padded responses, cut or padded to ``response_length`` (0 =
    the longest) with ``fill_id`` (default: the pad id), attended and trained only if ``train_padding``."""
    p_ids, p_mask = left_pad(prompts, wrapper.pad_token_id)
    width = response_length or max(len(r) for r in responses)
    fill = wrapper.pad_token_id if fill_id is None else fill_id
    r_ids = torch.full((len(responses), width), fill, dtype=torch.long)
    r_mask = torch.full((len(responses), width), int(train_padding), dtype=torch.long)
    for i, r in enumerate(responses):
        r = list(r)[:width]
        r_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        r_mask[i, : len(r)] = 1
    return SequenceBatch(torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1), p_ids.shape[1])


def run_sft(ctx: Context) -> dict[str, Any]:
    cfg = ctx.config
    tr = cfg.trainer
    comps = ctx.bundle(SFTComponents)
    wrapper = ctx.wrapper
    engine = ctx.engine

    examples = ctx.task.examples("train", seed=cfg.seed)
    missing = sum(1 for ex in examples if ex.response is None)
    if missing:
        raise DareError(
            f"task {cfg.task.name!r} gives {missing} training examples without a reference "
            f"response; supervised training needs task.train_path with answers"
        )
    eval_examples = ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
    collate = comps.collate or default_collate
    batches = BatchStream(examples, tr.batch_size, ctx.stream(STREAM_DATA))
    objective = SupervisedObjective(comps, wrapper, engine)
    engine.setup_optimizer(wrapper, tr)

    tracker = Tracker(ctx, eval_examples, batches)
    first = tracker.begin()
    wrapper.module.train()
    for step in range(first, tr.steps + 1):
        t0 = time.perf_counter()
        # the whole global batch is collated and corrupted on every rank (same padding and
        # draws as one process) and each rank trains on its rows
        items = next(batches)
        prompts = encode_prompts(wrapper, items, tr.max_prompt_length)
        responses = [(wrapper.encode(ex.response) + [wrapper.eos_token_id])[: tr.max_response_length] for ex in items]
        rows = torch.tensor(engine.shard(range(len(items))))
        full = collate(prompts, responses, wrapper).to(wrapper.device)
        corrupted = (
            comps.corruption(wrapper, full, ctx.stream(STREAM_CORRUPTION, step))
            if comps.corruption is not None
            else None
        )
        part = UpdateBatch(full.select(rows), corrupted.select(rows) if corrupted is not None else None)
        lr = lr_at(tr, step - 1)
        stats = update(
            engine, objective, [part], UpdatePlan(micro_batch=tr.micro_batch_size, grad_clip=tr.grad_clip, lr=lr)
        )
        record = {  # this rank's shares times the world size: the ranks' mean is the batch loss
            "step": step,
            "loss": stats.loss,
            "grad_norm": stats.grad_norm,
            "skipped_steps": stats.skipped_steps,
            "lr": lr,
            "time_step": round(time.perf_counter() - t0, 3),
            **stats.metrics,
        }
        record = tracker.step_end(step, record, loss=f"{record['loss']:.4f}")
    return tracker.finish({"steps": tr.steps, "final_loss_mean_last20": tracker.last("loss", 20)})


@attrs.frozen
class SupervisedObjective:
    """The supervised objective of some rows (:class:`~dare_core.interfaces.UpdateObjective`):
    estimator over the rows' corruption → :class:`SFTObjective` → backward. ``engine``: its
    backward and compute precision (``None``: torch's)."""

    components: SFTComponents
    wrapper: ModelWrapper
    engine: Optional[Engine] = None

    def totals(self, part: UpdateBatch) -> Totals:
        """:meth:`SFTObjective.totals` of the rows."""
        return self.components.loss.totals(part.batch)

    def backward(self, part: UpdateBatch, totals: Totals, scale: float) -> tuple[torch.Tensor, dict[str, float]]:
        """``scale · ∇loss`` of the rows into the gradients; returns ``(detached loss, metrics)``."""
        comps, engine = self.components, self.engine
        with engine.autocast() if engine is not None else contextlib.nullcontext():
            logp = comps.estimator(self.wrapper, part.batch, part.corrupted)
            loss, metrics = comps.loss(logp, part.corrupted, part.batch, totals=totals)
        (engine.backward if engine is not None else torch.Tensor.backward)(loss * scale)
        return loss.detach(), metrics
