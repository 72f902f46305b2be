"""Engines decide how a step runs (processes, sharding, precision, optimizer, state), not what it
computes. The core registers ``single``; plugins register the others (``dare list engines``)."""

from typing import Any

from dare_core.engines.single import SingleProcessEngine


def build_engine(dare: Any, config: Any):
    """The engine ``engine.name`` names, built for ``config``."""
    return dare.registries.engines.get(config.engine.name).build(config)


__all__ = ["SingleProcessEngine", "build_engine"]
