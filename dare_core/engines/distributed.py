"""The base of multi-process engines: one process per device started by a launcher.

:class:`ProcessGroupEngine` joins the process group the launcher describes (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``: ``torchrun``, ``deepspeed``,
or ``srun`` with those variables exported), picks the rank's device (``cuda:LOCAL_RANK`` with
nccl, else the CPU with gloo) and implements the data-parallel collectives. Subclasses shard the
model, the optimizer and the checkpoint state.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from dare_core.engines.common import resolve_device
from dare_core.engines.single import SingleProcessEngine
from dare_core.errors import DareError

LAUNCH_HINT = (
    "start one process per device with a launcher, e.g. torchrun --nproc_per_node=N "
    "-m dare_core train ... (docs/engines.md)"
)


class ProcessGroupEngine(SingleProcessEngine):
    """Data parallelism with full replicas (``engine.name=ddp``): every rank holds the whole
    model and optimizer; gradients are averaged over ranks before clipping and stepping, so the
    replicas stay identical. Sharding engines extend it."""

    name = "ddp"

    def __init__(self, config: Any):
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise DareError(
                f"engine.name={config.engine.name} runs one process per device and "
                f"needs RANK and WORLD_SIZE from its launcher; {LAUNCH_HINT}"
            )
        local = int(os.environ.get("LOCAL_RANK", 0))
        kind = resolve_device(config.model.device)
        device = torch.device(f"cuda:{local}") if kind == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self._owns_group = not dist.is_initialized()
        if self._owns_group:  # on CUDA gloo too: CPU tensors (offloaded shards) reduce over it
            dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        super().__init__(config, device)

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        for p in self.params:  # every rank reduces the same tensors, used or not
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for g, part in zip(grads, flat.div_(self.world_size).split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
        return super().step(max_norm, lr)

    def save_state(self, path: str) -> None:
        if self.is_main:  # replicas: one copy
            super().save_state(path)

    def reduce_mean(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Numbers averaged over the ranks that report them (a rank may log a key the others do
        not, e.g. a non-finite count); other values as rank 0 has them."""
        mine = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        keys = sorted(set(self.gather(sorted(mine))))
        out = dict(metrics)
        if keys:
            t = torch.tensor(
                [[mine.get(k, 0.0), float(k in mine)] for k in keys], dtype=torch.float64, device=self._comm_device()
            )
            dist.all_reduce(t)
            out.update({k: v / max(1.0, n) for k, (v, n) in zip(keys, t.tolist())})
        return out

    def gather(self, items: list[Any]) -> list[Any]:
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, list(items))
        return [x for part in parts for x in part]

    def barrier(self) -> None:
        dist.barrier()

    def any_active(self, local: bool) -> bool:
        flag = torch.tensor([int(local)], device=self._comm_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()


def build_ddp(config: Any) -> ProcessGroupEngine:
    return ProcessGroupEngine(config)
