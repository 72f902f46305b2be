"""Protocols and data classes of DARE's seams. See ``docs/hooks.md``."""

from dare_core.interfaces.batch import Corrupted, RolloutBatch, SequenceBatch
from dare_core.interfaces.seams import (
    AdvantageEstimator,
    AlgorithmSpec,
    Components,
    ComponentSpec,
    ConfigSection,
    DiffusionKind,
    Example,
    ForwardCorruption,
    LikelihoodEstimator,
    ModelFamily,
    ModelWrapper,
    PolicyLoss,
    RolloutBackend,
    RolloutSpec,
    Score,
    Task,
    TaskSpec,
    TrajectoryBuilder,
    WorkflowKind,
)

__all__ = [
    "AdvantageEstimator", "AlgorithmSpec", "Components", "ComponentSpec", "ConfigSection", "Corrupted",
    "DiffusionKind", "Example", "ForwardCorruption", "LikelihoodEstimator", "ModelFamily",
    "ModelWrapper", "PolicyLoss", "RolloutBackend", "RolloutBatch", "RolloutSpec", "Score",
    "SequenceBatch", "Task", "TaskSpec", "TrajectoryBuilder", "WorkflowKind",
]
