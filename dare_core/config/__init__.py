"""Run configuration: schema, structuring and resolution."""

from dare_core.config.loader import render_with_help, resolve, to_dict
from dare_core.config.schema import (
    EngineConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainerConfig,
    option,
)
from dare_core.config.structure import structure, structure_or_raise

__all__ = [
    "EngineConfig",
    "EvalConfig",
    "ModelConfig",
    "RunConfig",
    "TaskConfig",
    "TrainerConfig",
    "option",
    "render_with_help",
    "resolve",
    "structure",
    "structure_or_raise",
    "to_dict",
]
