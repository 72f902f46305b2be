"""The engine seam: how a run's steps execute, and the workflows that run them.

An engine owns everything that changes with the number of processes and the memory layout:
process-group set-up, placing/casting/sharding the policy and reference models, the precision
policy, the optimizer, backward / clipping / stepping, collective reductions and checkpoint
state. The workflows call these members only, so they run unchanged on every engine; the core
registers ``single`` (one process), plugins add distributed ones (``dare list engines``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Protocol, Sequence, TypeVar

import attrs

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class Engine(Protocol):
    """One run's execution engine (built once per process by :attr:`EngineSpec.build`).

    Data parallelism: every rank runs the same workflow on its slice of each global batch
    (:meth:`shard`); gradients are averaged over ranks by the engine, so with equal slices the
    update equals one process's update on the whole batch. Collective members (marked) must be
    called by every rank in the same order.
    """

    name: str
    rank: int
    world_size: int
    #: the device this rank computes on
    device: torch.device
    #: the resolved precision policy: ``fp32``, ``bf16-mixed`` or ``bf16``
    precision: str
    #: forwards of the prepared policy are collectives (parameters gathered per forward): the
    #: ranks generate in lockstep (:mod:`dare_core.engines.lockstep`)
    collective_forwards: bool

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run directory and the console."""

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous slice of a global batch (``len(items)`` divisible by the
        world size)."""

    def prepare(self, wrapper: Any, *, trainable: bool) -> None:
        """Place, cast and (sharding engines) wrap ``wrapper.module`` in place for the precision
        policy, after the checkpoint (and LoRA) is loaded. ``trainable=False``: inference only."""

    def reference(self, wrapper: Any) -> Any:
        """A frozen copy of the policy for reference log-likelihoods (full fine-tuning; under
        LoRA the workflows use the base model with the adapters disabled instead)."""

    def autocast(self) -> ContextManager[Any]:
        """The compute context of forward passes (bf16 autocast for ``bf16-mixed`` where the
        engine does not cast through its own wrapping; else a no-op)."""

    def setup_optimizer(self, wrapper: Any, trainer: Any) -> None:
        """Build the optimizer over the trainable parameters (AdamW with ``trainer``'s
        hyper-parameters, in the precision policy's master dtype). Collective."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of ``loss`` (already scaled by its share of the step)."""

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        """Clip the global gradient norm to ``max_norm`` (0 = no clipping), set the learning rate
        to ``lr`` and step — unless the norm is not finite; then zero the gradients.
        Returns ``(norm, stepped)``. Collective."""

    def reduce_mean(self, metrics: dict[str, float]) -> dict[str, float]:
        """Every numeric metric averaged over ranks (others as rank 0 has them). Collective."""

    def gather(self, items: list[Any]) -> list[Any]:
        """Every rank's ``items`` concatenated in rank order, on every rank. Collective."""

    def barrier(self) -> None:
        """Wait for every rank. Collective."""

    def any_active(self, local: bool) -> bool:
        """Whether this rank (``local``) or any other is still active: one all-reduce. Collective."""

    def save_state(self, path: str) -> None:
        """Write model and optimizer state (sharded where the engine shards) into the existing
        directory ``path``. Collective."""

    def load_state(self, path: str) -> None:
        """Restore what :meth:`save_state` wrote (same world size and engine). Collective."""

    def full_state_dict(self, wrapper: Any) -> Optional[dict[str, torch.Tensor]]:
        """The module's consolidated (unsharded, CPU) state dict on the main rank, ``None`` on
        the others — or ``None`` everywhere when the module already holds its full weights.
        Collective. Used to export HF-layout checkpoints."""

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds for the policy: ``parameters``, ``gradients``,
        ``optimizer`` (its state) — local shards only (``dare bench engines``)."""

    def close(self) -> None:
        """Tear down what the engine set up (process group)."""


@attrs.frozen
class EngineSpec:
    """An engine as registered by a plugin.

    Attributes:
        name: the ``engine.name`` value.
        build: ``build(config: RunConfig) -> Engine``; may raise a one-line ``DareError`` (e.g.
            started without its launcher).
        description: one line for ``dare list engines``.
        distributed: needs a launcher (``torchrun``) that sets ``RANK`` / ``WORLD_SIZE``.
    """

    name: str
    build: Callable[[Any], Engine]
    description: str = ""
    distributed: bool = False


@attrs.frozen
class WorkflowSpec:
    """A training loop an algorithm names in :attr:`AlgorithmSpec.workflow`.

    Attributes:
        name: the workflow name (``rl``, ``sft``, ...).
        run: ``run(ctx) -> summary dict`` given the run's ``Context``.
        description: one line for ``dare list workflows``.
    """

    name: str
    run: Callable[[Any], dict[str, Any]]
    description: str = ""
