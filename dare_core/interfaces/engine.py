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

from dare_core.interfaces.seams import Components

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
    #: where the workflows load the checkpoint: ``device``, or ``meta`` (the structure only, see
    #: a family's ``load``) for an engine whose :meth:`prepare` fills its shards from the checkpoint
    load_device: torch.device
    #: :meth:`load_state` restores a checkpoint written by another world size (resharding it);
    #: else resuming refuses one in one line
    reshards_state: bool
    #: the resolved precision policy: ``fp32``, ``bf16-mixed`` or ``bf16``
    precision: str
    #: forwards of the prepared policy are collectives (parameters gathered per forward): the
    #: ranks generate in lockstep (:mod:`dare_core.engines.lockstep`)
    collective_forwards: bool

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run directory and the console."""

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's part of a global batch.

        Args:
            items: the global batch (its length divisible by the world size).

        Returns:
            this rank's contiguous slice, ``len(items) / world_size`` items.
        """

    def prepare(self, wrapper: Any, *, trainable: bool) -> None:
        """Place, cast and (sharding engines) wrap ``wrapper.module`` in place for the precision
        policy, after the checkpoint (and LoRA) is loaded.

        Args:
            wrapper: the :class:`~dare_core.interfaces.ModelWrapper` to prepare.
            trainable: ``False``: inference only (no gradients, no optimizer).
        """

    def reference(self, wrapper: Any) -> Any:
        """A frozen copy of the policy for reference log-likelihoods (full fine-tuning; under
        LoRA the workflows use the base model with the adapters disabled instead).

        Args:
            wrapper: the prepared policy.

        Returns:
            a wrapper around the copy (eval mode, no gradients).
        """

    def autocast(self) -> ContextManager[Any]:
        """The compute context of forward passes.

        Returns:
            bf16 autocast for ``bf16-mixed`` where the engine does not cast through its own
            wrapping; else a no-op context.
        """

    def setup_optimizer(self, wrapper: Any, trainer: Any) -> None:
        """Build the optimizer over the trainable parameters (AdamW, in the precision policy's
        master dtype). Collective.

        Args:
            wrapper: the prepared policy.
            trainer: the run's ``trainer:`` section (its optimizer hyper-parameters).
        """

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of a loss.

        Args:
            loss: a scalar, already scaled by its share of the step (and by the world size:
                the engine averages gradients over ranks).
        """

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        """Clip, set the learning rate and step the optimizer — unless the gradient norm is not
        finite; then zero the gradients. Collective.

        Args:
            max_norm: the global gradient norm to clip to (0 = no clipping).
            lr: the learning rate of this step.

        Returns:
            ``(norm, stepped)``: the global gradient norm before clipping and whether the
            optimizer stepped.
        """

    def reduce_mean(self, metrics: dict[str, float]) -> dict[str, float]:
        """Average a step's record over ranks. Collective.

        Args:
            metrics: this rank's record.

        Returns:
            the record with every number (not a bool, not ``step``) averaged over the ranks
            that report it; other values as this rank has them.
        """

    def gather(self, items: list[Any]) -> list[Any]:
        """Collect picklable items from every rank. Collective.

        Args:
            items: this rank's items.

        Returns:
            every rank's ``items`` concatenated in rank order, on every rank.
        """

    def barrier(self) -> None:
        """Wait for every rank. Collective."""

    def any_active(self, local: bool) -> bool:
        """One all-reduce of activity flags (lockstep generation). Collective.

        Args:
            local: whether this rank is still active.

        Returns:
            whether this rank or any other is still active.
        """

    def save_state(self, path: str) -> None:
        """Write model and optimizer state (sharded where the engine shards). Collective.

        Args:
            path: an existing directory.
        """

    def load_state(self, path: str) -> None:
        """Restore what :meth:`save_state` wrote (the same engine; another world size where
        :attr:`reshards_state`). Collective.

        Args:
            path: the directory :meth:`save_state` wrote.
        """

    def full_state_dict(self, wrapper: Any) -> Optional[dict[str, torch.Tensor]]:
        """The module's consolidated weights, to export HF-layout checkpoints. Collective.

        Args:
            wrapper: the prepared policy.

        Returns:
            the consolidated (unsharded, CPU) state dict on the main rank, ``None`` on the
            others — or ``None`` everywhere when the module already holds its full weights.
        """

    def export_weights(self, wrapper: Any, directory: str, dtype: torch.dtype) -> bool:
        """Write the module's weights (not LoRA's adapters) in HF layout into ``directory`` from
        every rank's own shards, so that no rank holds the whole model, with the config,
        generation config and tokenizer ``save_pretrained`` writes. Collective.

        Args:
            wrapper: the prepared policy.
            directory: an existing, empty directory.
            dtype: the storage dtype of the floating-point weights (``model.dtype``).

        Returns:
            whether it wrote them; ``False`` (nothing written) for an engine without a sharded
            writer: the workflows then write :meth:`full_state_dict` from rank 0.

        Raises:
            DivergenceError: a weight is not finite (nothing written, on every rank).
        """

    def memory(self) -> dict[str, int]:
        """What this rank holds for the policy (``dare bench engines``).

        Returns:
            bytes of ``parameters``, ``gradients`` and ``optimizer`` (its state), local shards only.
        """

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
        components: the bundle its loop reads (:class:`~dare_core.interfaces.RLComponents`,
            ...); config resolution refuses an algorithm whose ``build`` returns another.
    """

    name: str
    run: Callable[[Any], dict[str, Any]]
    description: str = ""
    components: type[Components] = Components
