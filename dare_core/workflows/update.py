"""One update step for every loop: epochs × mini-batches × micro-batches through the engine.

The RL, supervised and preference loops (and ``dare bench rl``) hand :func:`update` this rank's
rows as :class:`UpdateBatch` — one per corruption draw — with the workflow's
:class:`UpdateObjective` and an :class:`UpdatePlan`, and read back :class:`UpdateStats`.

Per PPO epoch the rows are taken in order (or shuffled by the plan's stream), cut into
mini-batches (one optimizer step each) and each mini-batch into micro-batches (one forward and
backward each). Every micro-batch's loss is normalised by the mini-batch's totals (the objective's
``totals`` of every micro-batch, summed over them and over ranks before the first backward) and
its backward is scaled by the world size (the engine averages gradients over ranks), so the
gradient is the mini-batch objective's for any ``trainer.micro_batch_size`` and world size
(docs/engines.md, "Normalisation").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import attrs
import torch

from dare_core.components.losses import sum_totals
from dare_core.interfaces.update import Totals, UpdateBatch, UpdateObjective
from dare_core.workflows.batching import chunks

if TYPE_CHECKING:
    from dare_core.interfaces.engine import Engine


@attrs.frozen
class UpdatePlan:
    """How :func:`update` walks the rows.

    Attributes:
        micro_batch: rows per forward and backward (``trainer.micro_batch_size``).
        mini_batch: this rank's rows per optimizer step; 0: all of them.
        epochs: passes over the rows (PPO epochs); epoch ``e`` uses draw ``e mod len(draws)``.
        unit: consecutive rows that stay in one micro-batch (2: a preference pair).
        grad_clip: the global gradient norm clipped to (0: none).
        lr: the learning rate of every optimizer step.
        order: ``order(epoch)``, the stream an epoch's rows are shuffled with; ``None``: in order.
    """

    micro_batch: int
    mini_batch: int = 0
    epochs: int = 1
    unit: int = 1
    grad_clip: float = 0.0
    lr: float = 0.0
    order: Optional[Callable[[int], torch.Generator]] = None


@attrs.frozen
class UpdateStats:
    """What one update did.

    Attributes:
        loss: the mini-batch objective (this rank's share times the world size: the ranks' mean
            is the global value), averaged over the optimizer steps.
        grad_norm: the global gradient norm before clipping, averaged over the optimizer steps.
        optimizer_steps: optimizer steps taken; skipped_steps: those the engine skipped
            (non-finite gradients).
        metrics: the objective's metrics, weighted by rows within a mini-batch and averaged over
            mini-batches.
    """

    loss: float
    grad_norm: float
    optimizer_steps: int
    skipped_steps: int
    metrics: dict[str, float]


def global_totals(engine: Optional[Engine], parts: list[Totals]) -> Totals:
    """The sum of ``parts`` (the totals of micro-batches) over them and over ranks (one gather when
    the engine has several), on the parts' device."""
    local = sum_totals(parts)
    if engine is None or engine.world_size == 1:
        return local
    device = next(iter(local.values())).device
    every = engine.gather([{k: v.cpu() for k, v in local.items()}])
    return {k: v.to(device) for k, v in sum_totals(every).items()}


def backward_minibatch(
    engine: Optional[Engine], objective: UpdateObjective, rows: UpdateBatch, plan: UpdatePlan
) -> tuple[float, dict[str, float]]:
    """Accumulate the gradient of the mini-batch ``rows`` in micro-batches of
    ``plan.micro_batch`` rows (whole units); no optimizer step.

    Returns:
        this rank's share of the mini-batch loss and the row-weighted mean of the metrics.
    """
    per_micro = max(1, plan.micro_batch // plan.unit) * plan.unit
    parts = [torch.arange(sl.start, sl.stop) for sl in chunks(rows.num_rows, per_micro)]
    micro = [rows.select(idx) for idx in parts]
    totals = global_totals(engine, [objective.totals(m) for m in micro])
    scale = float(engine.world_size if engine is not None else 1)
    loss_sum = 0.0
    metrics: dict[str, float] = {}
    for m in micro:
        loss, values = objective.backward(m, totals, scale)
        loss_sum += float(loss)
        share = m.num_rows / rows.num_rows
        for k, v in values.items():
            metrics[k] = metrics.get(k, 0.0) + float(v) * share
    return loss_sum, metrics


def update(engine: Engine, objective: UpdateObjective, draws: Sequence[UpdateBatch], plan: UpdatePlan) -> UpdateStats:
    """Run ``plan.epochs`` passes over this rank's rows, one optimizer step per mini-batch.

    Args:
        engine: the run's engine (backward, optimizer step, collectives).
        objective: the workflow's objective over the algorithm's components.
        draws: the rows under each corruption draw (one, or one per PPO epoch), all ``B`` rows.
        plan: micro- and mini-batch sizes, epochs, the learning rate and clipping.

    Returns:
        :class:`UpdateStats` of the optimizer steps taken.
    """
    total = draws[0].num_rows
    mini = plan.mini_batch or total
    losses, norms, skipped = [], [], 0
    metrics: dict[str, float] = {}
    for epoch in range(plan.epochs):
        order = _order(total, plan, epoch)
        for sl in chunks(len(order), mini):
            loss, values = backward_minibatch(engine, objective, draws[epoch % len(draws)].select(order[sl]), plan)
            norm, ok = engine.step(plan.grad_clip, plan.lr)
            losses.append(loss * engine.world_size)
            norms.append(norm)
            skipped += 0 if ok else 1
            for k, v in values.items():
                metrics[k] = metrics.get(k, 0.0) + v
    n = max(1, len(losses))
    return UpdateStats(
        loss=sum(losses) / n,
        grad_norm=sum(norms) / n,
        optimizer_steps=len(losses),
        skipped_steps=skipped,
        metrics={k: v / n for k, v in metrics.items()},
    )


def _order(total: int, plan: UpdatePlan, epoch: int) -> torch.Tensor:
    """The rows of an epoch: in order, or whole units shuffled by ``plan.order(epoch)``."""
    if plan.order is None:
        return torch.arange(total)
    units = torch.randperm(total // plan.unit, generator=plan.order(epoch))
    return (units[:, None] * plan.unit + torch.arange(plan.unit)).reshape(-1)
