"""Trajectory builders: what a rollout records and how it becomes training input."""

from __future__ import annotations

from dare_core.interfaces import RolloutBatch, SequenceBatch


class FinalSequence:
    """Training input is the final ``[prompt | response]`` sequence; nothing else is recorded."""

    records: frozenset[str] = frozenset()

    def build(self, rollout: RolloutBatch) -> SequenceBatch:
        return rollout.sequences()
