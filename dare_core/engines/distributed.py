"""Multi-process engines: one process per device started by a launcher.

:class:`ProcessGroup` joins the process group the launcher describes (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``: ``torchrun``, ``deepspeed``, or ``srun`` with
those variables exported), picks the rank's device (``cuda:LOCAL_RANK`` with nccl, else the CPU
with gloo) and implements the data-parallel collectives. Every multi-process engine holds one
(``SingleProcessEngine(config, group.device, group=group)``): :class:`ProcessGroupEngine` (``ddp``)
averages the gradients over it; the sharding engines (plugins) shard the model, the optimizer and
the checkpoint state themselves.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Sequence, cast

import torch
import torch.distributed as dist

from dare_core.engines.common import resolve_device
from dare_core.engines.single import SingleProcessEngine
from dare_core.errors import DareError

LAUNCH_HINT = (
    "start one process per device with a launcher, e.g. torchrun --nproc_per_node=N "
    "-m dare_core train ... (docs/engines.md)"
)


class ProcessGroup:
    """The process group of a run of one process per device, joined from the launcher's
    environment (or an existing default group, which :meth:`close` then leaves alone), and its
    data-parallel collectives; what every multi-process engine holds (``group=``).

    Attributes:
        rank, world_size: this process's rank and the number of processes.
        device: the rank's device: ``cuda:LOCAL_RANK`` with nccl, else the CPU with gloo.
        owns: whether this object initialised the default group (and destroys it on ``close``).
    """

    def __init__(self, config: Any):
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise DareError(
                f"engine.name={config.engine.name} runs one process per device and "
                f"needs RANK and WORLD_SIZE from its launcher; {LAUNCH_HINT}"
            )
        local = int(os.environ.get("LOCAL_RANK", 0))
        kind = resolve_device(config.model.device)
        self.device = torch.device(f"cuda:{local}") if kind == "cuda" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.owns = not dist.is_initialized()
        if self.owns:  # on CUDA gloo too: CPU tensors (offloaded shards) reduce over it
            dist.init_process_group(
                "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo",
                timeout=datetime.timedelta(seconds=config.engine.timeout),
            )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def average(self, tensors: Sequence[torch.Tensor]) -> None:
        """Average ``tensors`` over the ranks in place, in one all-reduce of their concatenation
        (every rank passes tensors of the same shapes, in the same order)."""
        tensors = list(tensors)
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        for t, part in zip(tensors, flat.div_(self.world_size).split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))

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
                [[mine.get(k, 0.0), float(k in mine)] for k in keys], dtype=torch.float64, device=self.comm_device()
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
        flag = torch.tensor([int(local)], device=self.comm_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def comm_device(self) -> torch.device:
        """Where small collective tensors live: the rank's device under nccl, else the CPU."""
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def close(self) -> None:
        if self.owns and dist.is_initialized():
            dist.destroy_process_group()


class ProcessGroupEngine(SingleProcessEngine):
    """Data parallelism with full replicas (``engine.name=ddp``): every rank holds the whole
    model and optimizer; gradients are averaged over the ranks (its :class:`ProcessGroup`) before
    clipping and stepping, so the replicas stay identical."""

    name = "ddp"

    def __init__(self, config: Any):
        group = ProcessGroup(config)
        super().__init__(config, group.device, group=group)

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        for p in self.params:  # every rank reduces the same tensors, used or not
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.group.average([cast(torch.Tensor, p.grad) for p in self.params])  # each set above
        return super().step(max_norm, lr)

    def save_state(self, path: str) -> None:
        if self.is_main:  # replicas: one copy
            super().save_state(path)


def build_ddp(config: Any) -> ProcessGroupEngine:
    return ProcessGroupEngine(config)
