"""Trajectory builders: what a rollout records and how it becomes training input."""

from __future__ import annotations

from dare_core.interfaces import RolloutBatch, TrainingRows, TrajectoryContext


class FinalSequence:
    """Training input is the final ``[prompt | response]`` sequence with the rollout's
    advantages; nothing else is recorded."""

    records: frozenset[str] = frozenset()

    def rows(self, wrapper, rollout: RolloutBatch, context: TrajectoryContext) -> TrainingRows:
        return TrainingRows(rollout.sequences(), context.advantages)
