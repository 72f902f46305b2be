"""The single-process engine (``engine.name=single``), and the base every engine extends.

:class:`SingleProcessEngine` implements the whole :class:`~dare_core.interfaces.Engine` seam for
one process: the precision policy on the module, AdamW (compensated for pure bf16), the clipped
step that skips non-finite gradients, and state as one file. Its collectives are those of the
group it holds: :class:`LocalGroup` (one process, nothing to exchange) or, for a multi-process
engine, a :class:`~dare_core.engines.distributed.ProcessGroup`; multi-process engines pass one in
and override what sharding changes.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Optional, Sequence, TypeVar, cast

import torch
from torch.distributed.tensor import DTensor

from dare_core.engines.common import (
    adamw,
    autocast_for,
    cast_for_precision,
    grad_norm,
    resolve_device,
    resolve_precision,
    set_lr,
    trainable_parameters,
)
from dare_core.errors import DareError

T = TypeVar("T")

STATE_FILE = "engine_state.pt"


class LocalGroup:
    """The collectives of a single process: rank 0 of 1, nothing to exchange."""

    rank = 0
    world_size = 1

    def average(self, tensors: Sequence[torch.Tensor]) -> None:
        """Average ``tensors`` over the ranks in place (one rank: unchanged)."""

    def reduce_mean(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return dict(metrics)

    def gather(self, items: list[Any]) -> list[Any]:
        return list(items)

    def barrier(self) -> None:
        pass

    def any_active(self, local: bool) -> bool:
        return bool(local)

    def close(self) -> None:
        pass


class SingleProcessEngine:
    """The ``Engine`` seam for one process; ``group``: the collectives the engine runs over
    (default :class:`LocalGroup`), its ``rank`` and ``world_size`` the engine's."""

    name = "single"
    rank, world_size = 0, 1
    collective_forwards = False
    reshards_state = True  # the whole trainable state, the same for any number of replicas

    def __init__(self, config: Any, device: Optional[torch.device] = None, group: Any = None):
        self.config = config
        self.group = LocalGroup() if group is None else group
        self.rank, self.world_size = self.group.rank, self.group.world_size
        self.device = torch.device(device or resolve_device(config.model.device))
        self.load_device = self.device
        self.precision = resolve_precision(config.engine, self.device, self.precisions())
        self.module: Optional[torch.nn.Module] = None
        self.optimizer: Any = None
        self.params: list[torch.nn.Parameter] = []

    @classmethod
    def precisions(cls) -> tuple[str, ...]:
        return ("fp32", "bf16-mixed", "bf16")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- data ---------------------------------------------------------------------------------
    def shard(self, items: Sequence[T]) -> list[T]:
        items = list(items)
        if len(items) % self.world_size:
            raise DareError(
                f"{len(items)} items cannot be split evenly over {self.world_size} "
                f"processes; make the batch a multiple of the world size"
            )
        n = len(items) // self.world_size
        return items[self.rank * n : (self.rank + 1) * n]

    def any_active(self, local: bool) -> bool:
        return self.group.any_active(local)

    # -- models -------------------------------------------------------------------------------
    def prepare(self, wrapper: Any, *, trainable: bool) -> None:
        cast_for_precision(wrapper.module, self.precision, trainable)
        wrapper.placed = self.device
        if trainable:
            self.module = wrapper.module

    def reference(self, wrapper: Any) -> Any:
        ref = copy.copy(wrapper)
        ref.module = copy.deepcopy(wrapper.module).eval().requires_grad_(False)
        return ref

    def autocast(self) -> Any:
        return autocast_for(self.precision, self.device)

    # -- optimisation -------------------------------------------------------------------------
    def setup_optimizer(self, wrapper: Any, trainer: Any) -> None:
        self.module = wrapper.module
        self.params = trainable_parameters(wrapper.module)
        update = self.config.engine.bf16_update if self.precision == "bf16" else "none"
        self.optimizer = adamw(self.params, trainer, update)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        norm = float(grad_norm(self.params, max_norm))
        finite = bool(torch.isfinite(torch.tensor(norm)))
        if finite:
            set_lr(self.optimizer, lr)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, finite

    # -- collectives (the group's) --------------------------------------------------------------
    def reduce_mean(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return self.group.reduce_mean(metrics)

    def gather(self, items: list[Any]) -> list[Any]:
        return self.group.gather(items)

    def barrier(self) -> None:
        self.group.barrier()

    # -- state --------------------------------------------------------------------------------
    @property
    def _trained(self) -> torch.nn.Module:
        """The trained module, which ``prepare(trainable=True)`` or ``setup_optimizer`` set."""
        return cast(torch.nn.Module, self.module)

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self._trained.named_parameters() if p.requires_grad}

    def save_state(self, path: str) -> None:
        torch.save(
            {"model": self._trainable_state(), "optimizer": self.optimizer.state_dict()}, os.path.join(path, STATE_FILE)
        )

    def load_state(self, path: str) -> None:
        state = torch.load(os.path.join(path, STATE_FILE), map_location=self.device, weights_only=True)
        missing = sorted(set(self._trainable_state()) - set(state["model"]))
        if missing:
            raise DareError(
                f"checkpoint {path} lacks trainable weights ({missing[0]}, ...): it was "
                f"written by a run with other trainable parameters (LoRA settings)"
            )
        with torch.no_grad():
            for n, p in self._trained.named_parameters():
                if n in state["model"]:
                    p.copy_(state["model"][n])
        self.optimizer.load_state_dict(state["optimizer"])

    def full_state_dict(self, wrapper: Any) -> Optional[dict[str, torch.Tensor]]:
        return None

    def export_weights(self, wrapper: Any, directory: str, dtype: torch.dtype) -> bool:
        return False

    def memory(self) -> dict[str, int]:
        def size(tensors: Any) -> int:
            local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
            return sum(t.numel() * t.element_size() for t in local if isinstance(t, torch.Tensor))

        params = list(self._trained.parameters())
        state = [v for s in self.optimizer.state.values() for v in s.values()] if self.optimizer else []
        return {"parameters": size(params), "gradients": size(p.grad for p in params), "optimizer": size(state)}

    def close(self) -> None:
        self.group.close()


def build_single(config: Any) -> SingleProcessEngine:
    return SingleProcessEngine(config)
