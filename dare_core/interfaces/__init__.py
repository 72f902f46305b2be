"""Protocols and data classes of DARE's seams. See ``docs/hooks.md``."""

from dare_core.interfaces.batch import Corrupted, RolloutBatch, SequenceBatch
from dare_core.interfaces.engine import Engine, EngineSpec, WorkflowSpec
from dare_core.interfaces.rows import TrainingRows, TrajectoryContext
from dare_core.interfaces.seams import (
    AccumulatingLoss, AdvantageEstimator, AlgorithmSpec, Components, ComponentSpec, ConfigSection,
    DiffusionKind, Example, ForwardCorruption, LikelihoodEstimator, ModelFamily, ModelWrapper,
    PolicyLoss, PreferenceLoss, RolloutBackend, RolloutSpec, RowEstimate, Score, SFTObjective, SyncedRolloutBackend,
    Task, TaskSpec, TrajectoryBuilder, WorkflowKind,
)
from dare_core.interfaces.update import Totals, UpdateBatch, UpdateObjective

__all__ = [
    "AccumulatingLoss", "AdvantageEstimator", "AlgorithmSpec", "Components", "ComponentSpec",
    "ConfigSection", "Corrupted", "DiffusionKind", "Engine", "EngineSpec", "Example", "ForwardCorruption",
    "LikelihoodEstimator", "ModelFamily", "ModelWrapper", "PolicyLoss", "PreferenceLoss",
    "RolloutBackend", "RolloutBatch", "RolloutSpec", "RowEstimate", "SFTObjective", "Score",
    "SequenceBatch", "SyncedRolloutBackend", "Task", "TaskSpec", "Totals", "TrainingRows", "TrajectoryBuilder", "TrajectoryContext",
    "UpdateBatch", "UpdateObjective", "WorkflowKind", "WorkflowSpec",
]
