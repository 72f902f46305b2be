"""Engines decide how a step runs (processes, sharding, precision, optimizer, state), not what it
computes. The core registers ``single``; plugins register the others (``dare list engines``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dare_core.engines.single import SingleProcessEngine

if TYPE_CHECKING:
    from dare_core.plugins import Dare


def build_engine(dare: Dare, config: Any):
    """The engine ``engine.name`` names, built for ``config``."""
    return dare.registries.engines.get(config.engine.name).build(config)


__all__ = ["SingleProcessEngine", "build_engine"]
