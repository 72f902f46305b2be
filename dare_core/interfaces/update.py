"""The rows of one update and the objective a workflow makes of them (the update step's seam,
run by :func:`dare_core.workflows.update.update`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol

import attrs

if TYPE_CHECKING:
    import torch

from dare_core.interfaces.batch import Corrupted, SequenceBatch

#: additive statistics of some rows that a loss divides by, e.g. ``{"tokens": Σ mask, "rows": B}``:
#: float64 tensors (scalars or small vectors); the loops sum them over micro-batches and ranks
Totals = dict[str, "torch.Tensor"]


@attrs.frozen
class UpdateBatch:
    """This rank's row-aligned inputs of one update (``B`` rows).

    Attributes:
        batch: ``[B, S]`` sequences; ``input_ids`` are the likelihood targets.
        corrupted: model inputs ``[M, B, S]``; ``None``: the estimator needs none.
        old_logp: the rollout policy's log-likelihoods, estimator-shaped with the rows on dim 1
            (``[M, B, R]`` or ``[M, B]``); ``None``: the policy has not changed since the rollout,
            so they are the update's own forward, detached.
        ref_logp: the reference policy's, same shape; ``None``: no reference.
        advantages: ``[B]`` scalar advantage per row (RL).
        weights: token weights ``[B, R]`` or ``[M, B, R]`` (RL: the loss's mask).
        extras: row-aligned tensors (dim 0 = ``B``) for the loss.
    """

    batch: SequenceBatch
    corrupted: Optional[Corrupted] = None
    old_logp: Optional[torch.Tensor] = None
    ref_logp: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    weights: Optional[torch.Tensor] = None
    extras: dict[str, torch.Tensor] = attrs.field(factory=dict)

    @property
    def num_rows(self) -> int:
        return self.batch.batch_size

    def select(self, idx: torch.Tensor) -> UpdateBatch:
        """The rows ``idx`` (``[k]`` long) of every member, each on its own row dimension."""

        def rows(t: Optional[torch.Tensor], dim: int) -> Optional[torch.Tensor]:
            return None if t is None else t.index_select(dim % t.dim(), idx.to(t.device))

        return UpdateBatch(
            batch=self.batch.select(idx),
            corrupted=self.corrupted.select(idx) if self.corrupted is not None else None,
            old_logp=rows(self.old_logp, 1),
            ref_logp=rows(self.ref_logp, 1),
            advantages=rows(self.advantages, 0),
            weights=rows(self.weights, -2),
            extras={k: v.index_select(0, idx.to(v.device)) for k, v in self.extras.items()},
        )


class UpdateObjective(Protocol):
    """What a workflow's loss makes of some rows of an update; one per workflow (RL, SFT,
    preference), wrapping the algorithm's components."""

    def totals(self, part: UpdateBatch) -> Totals:
        """What the loss divides by, of some rows, before any forward.

        Args:
            part: a micro-batch of ``B`` rows.

        Returns:
            the loss's totals of those rows (RL: ``PolicyLoss.totals(part.weights, part.extras)``;
            SFT and preference: ``loss.totals(part.batch)``); :func:`~dare_core.workflows.update.update`
            sums them over the mini-batch's micro-batches and ranks.
        """

    def backward(self, part: UpdateBatch, totals: Totals, scale: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Add ``scale · ∇loss(part)`` to the gradients, through the engine's backward.

        Args:
            part: a micro-batch of ``B`` rows (``corrupted`` ``[M, B, S]``, ``old_logp`` /
                ``ref_logp`` estimator-shaped, ``advantages`` ``[B]``, ``weights`` ``[B, R]`` or
                ``[M, B, R]``).
            totals: the mini-batch's summed :meth:`totals` the loss is normalised by.
            scale: the factor of the backward (the world size).

        Returns:
            ``(loss, metrics)``: the detached loss of the rows and plain-float metrics.
        """
