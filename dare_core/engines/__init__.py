"""Engines decide how a step runs (processes, sharding, reductions), not what it computes."""

from dare_core.engines.single import SingleProcessEngine

ENGINES = {"single": SingleProcessEngine}


def build_engine(name: str, device: str):
    return ENGINES[name](device)


__all__ = ["ENGINES", "SingleProcessEngine", "build_engine"]
