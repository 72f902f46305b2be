"""Training rows: what a trajectory builder hands the RL loop when the final sequence is not the
whole story.

A trajectory builder's ``rows(wrapper, rollout, context)`` (:class:`~dare_core.interfaces.TrajectoryBuilder`)
returns them. Beyond the final sequence with the rollout's advantages, a builder may

* turn one rollout row into several training rows (one per recorded denoising state, one per
  tree transition, ...), each with its own scalar advantage;
* provide the model inputs itself (``corrupted``: deterministic intermediate states replayed from
  the rollout record) instead of a random corruption;
* give token weights per corruption row (``weights`` ``[M, N, R]``) instead of the response mask;
* pass row-aligned tensors (``extras``) to its loss as the keyword argument ``extras``.

The loop draws nothing when ``corrupted`` is given: the same states are used for the old,
reference and new log-likelihoods and every PPO epoch (common random numbers hold trivially).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import attrs

if TYPE_CHECKING:
    import torch

from dare_core.interfaces.batch import Corrupted, SequenceBatch

#: ``score(response_ids [N, R], response_mask [N, R], rollout_rows [N]) -> rewards [N]``: the task
#: reward of arbitrary responses, each scored against the example of rollout row ``rollout_rows[i]``.
ScoreFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


@attrs.frozen
class TrajectoryContext:
    """What ``TrajectoryBuilder.rows`` may use besides the rollout.

    Attributes:
        rewards: ``[B]`` float32 task rewards of the final responses (CPU).
        advantages: ``[B]`` advantages from the algorithm's advantage estimator (model device).
        group_ids: ``[B]`` long prompt-group id of every rollout row (CPU).
        score: :data:`ScoreFn`, rewards of other (e.g. intermediate) responses.
        step: 1-based training step; ``total_steps`` the run's number of steps.
        generator: the run's random stream.
    """

    rewards: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    score: ScoreFn
    step: int = 1
    total_steps: int = 1
    generator: Optional[torch.Generator] = None


@attrs.define
class TrainingRows:
    """Training input of one rollout batch.

    Attributes:
        batch: ``[N, S]`` training rows; ``input_ids`` are the likelihood *targets*.
        advantages: ``[N]`` scalar advantage per row.
        corrupted: model inputs ``[M, N, S]`` (deterministic states); ``None`` = the
            algorithm's corruption is drawn once from ``batch``.
        weights: token weights for the loss, ``[N, R]`` or ``[M, N, R]``; ``None`` = the
            response mask of ``batch``.
        extras: row-aligned tensors (dim 0 = ``N``) given to the loss as ``extras=``.
        metrics: numbers to log for this step (e.g. mean intermediate reward).
    """

    batch: SequenceBatch
    advantages: torch.Tensor
    corrupted: Optional[Corrupted] = None
    weights: Optional[torch.Tensor] = None
    extras: dict[str, torch.Tensor] = attrs.field(factory=dict)
    metrics: dict[str, float] = attrs.field(factory=dict)

    @property
    def num_rows(self) -> int:
        """``N``, the number of training rows."""
        return self.batch.batch_size

    def loss_weights(self) -> torch.Tensor:
        """The loss's ``mask``: ``weights`` (``[N, R]`` or ``[M, N, R]``) or the float response
        mask ``[N, R]``; the row dim is ``-2``."""
        return self.weights if self.weights is not None else self.batch.response_mask.float()

    def select_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """The loss weights of the rows ``idx`` (``[k]`` long): ``[k, R]`` or ``[M, k, R]``."""
        w = self.loss_weights()
        return w.index_select(w.dim() - 2, idx.to(w.device))

    def select_extras(self, idx: torch.Tensor) -> dict[str, Any]:
        """The extras of the rows ``idx`` (``[k]`` long), each ``[k, ...]``."""
        return {k: v.index_select(0, idx.to(v.device)) for k, v in self.extras.items()}
