"""The single-process engine.

The workflows are written data-parallel: they shard prompts with :meth:`shard` (groups stay whole
on one rank because sharding happens before the group expansion), wrap the module with
:meth:`wrap`, and reduce metrics with :meth:`reduce_mean` before logging. A multi-process engine
implements the same four members.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import torch

T = TypeVar("T")


class SingleProcessEngine:
    rank = 0
    world_size = 1

    def __init__(self, device: str):
        self.device = torch.device(device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        return list(items)[self.rank :: self.world_size]

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def reduce_mean(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(metrics)
