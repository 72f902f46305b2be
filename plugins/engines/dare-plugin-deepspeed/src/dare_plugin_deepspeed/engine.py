"""The ``deepspeed`` engine: DeepSpeed ZeRO stages 1/2/3 behind DARE's engine seam.

:class:`DeepSpeedEngine` extends the core's :class:`~dare_core.api.SingleProcessEngine`, holding
the core's :class:`~dare_core.api.ProcessGroup` (process group from the launcher's
``RANK``/``WORLD_SIZE``, the rank's device, the collectives), and hands
the model, the optimizer, the gradient reduction, clipping and checkpoint state to a DeepSpeed
engine (``deepspeed.initialize``). What it adds to DeepSpeed's own behaviour:

* **The module stays the model.** The workflows call ``wrapper.module`` (its forward and its other
  methods, its parameter names) directly, not DeepSpeed's wrapper, so the bookkeeping DeepSpeed's
  ``forward`` does for the backward that follows is done in :meth:`DeepSpeedEngine.backward`.
* **Accumulation owned by the workflow.** A step runs any number of ``backward`` calls (one per
  micro-batch, several per micro-batch for Monte-Carlo accumulation losses), each already scaled by
  its share; DeepSpeed runs with ``gradient_accumulation_steps=1`` and
  ``managed_gradient_accumulation=false``, so every backward accumulates and ``step()`` is the
  boundary: the step's gradient is the sum of all backward calls, averaged over the processes.
* **The learning rate of each step** is written into the optimizer's parameter groups (no
  DeepSpeed scheduler); clipping is DeepSpeed's ``gradient_clipping``; a step whose global norm
  is not finite is skipped by DeepSpeed on every rank (ZeRO-3 always, ZeRO-1/2 in fp32 always and
  in bf16 with ``bf16.check_grad_overflow``, which the config pins).
* **Precision.** ``fp32``; ``bf16-mixed`` = DeepSpeed's bf16 mode: bf16 parameters and compute,
  fp32 master weights and optimizer state in the ZeRO optimizer. Pure ``bf16`` is refused.
* **ZeRO-3 and the logits-free head.** Partitioned parameters are gathered when a module is
  called; the fused cross entropy reads the output head's weight outside any module call, so under
  ZeRO-3 training runs the naive cross entropy (``model.cross_entropy=auto`` switches, ``fused``
  is refused). Parameters a module's forward reads from a child module (not through the child's
  call) are found by DeepSpeed while the module runs; the engine gathers them for the backward
  where DeepSpeed cannot hook the module's outputs.

References: ZeRO (Rajbhandari et al., arXiv:1910.02054); DeepSpeed configuration,
https://www.deepspeed.ai/docs/config-json/; DeepSpeed training API,
https://deepspeed.readthedocs.io/en/latest/training.html.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import sys
import warnings
from typing import Any, Callable, Optional

import attrs
import torch
import torch.distributed as dist

from dare_core.api import (
    DareError,
    ProcessGroup,
    SingleProcessEngine,
    adamw,
    cast_for_precision,
    info,
    set_lr,
    trainable_parameters,
)
from dare_plugin_deepspeed.config import SECTION, DeepSpeedConfig, deepspeed_config

#: the tag of the DeepSpeed checkpoint inside the state directory the core gives
TAG = "dare"


def import_deepspeed(device: torch.device) -> Any:
    """``deepspeed``, with its accelerator matching ``device`` (a CPU run selects DeepSpeed's CPU
    accelerator unless ``DS_ACCELERATOR`` says otherwise). One-line errors when it is missing, too
    old for the engine, or bound to another device type."""
    if "deepspeed" not in sys.modules and device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from deepspeed.runtime.engine import DeepSpeedEngine as _Engine
    except ImportError as exc:
        raise DareError(
            f"engine.name=deepspeed needs the deepspeed package, which cannot be imported "
            f"({' '.join(str(exc).split())}); pip install deepspeed"
        ) from None
    if not hasattr(_Engine, "managed_gradient_accumulation"):
        raise DareError(
            f"engine.name=deepspeed needs deepspeed>=0.19.8 (managed_gradient_accumulation); "
            f"installed: {deepspeed.__version__}; pip install -U deepspeed"
        )
    have = get_accelerator().device_name()
    if have != device.type:
        raise DareError(
            f"DeepSpeed's accelerator is {have} but this run computes on {device.type} "
            f"(model.device); set DS_ACCELERATOR={device.type} before starting the run"
        )
    return deepspeed


def console_quiet(call: Callable[[], Any]) -> Any:
    """``call()`` with what DeepSpeed prints while it sets up kept off the console, shown on stderr
    if the call fails: on a CPU run ``init_distributed`` JIT-builds its shared-memory comm op,
    which prints "... built successfully" on stdout and torch's cpp_extension "No CUDA runtime"
    warning on every rank. Also ignores, for the process, the FutureWarning DeepSpeed's ZeRO
    collectives raise on every step (it calls the ``all_gather_into_tensor`` /
    ``reduce_scatter_tensor`` that torch deprecates; DARE cannot change its calls)."""
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        category=FutureWarning,
    )
    captured, cpp_log = io.StringIO(), logging.getLogger("torch.utils.cpp_extension")
    level = cpp_log.level
    cpp_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(captured):
            return call()
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        cpp_log.setLevel(level)


class DeepSpeedEngine(SingleProcessEngine):
    """ZeRO data parallelism through DeepSpeed (``engine.name=deepspeed``, ``deepspeed.*``)."""

    name = "deepspeed"
    #: ZeRO's checkpoint holds each rank's partitions (DeepSpeed's ``ds_to_universal`` converts
    #: it offline to a universal checkpoint of another world size)
    reshards_state = False

    def __init__(self, config: Any):
        if config.engine.precision == "bf16":
            raise DareError(
                "engine.name=deepspeed does not run engine.precision=bf16: DeepSpeed keeps "
                "fp32 master weights of bf16 parameters; use engine.precision=bf16-mixed"
            )
        self.section: DeepSpeedConfig = config.plugin_section(SECTION, DeepSpeedConfig)
        #: ZeRO-3 partitions the parameters: every forward gathers them
        self.collective_forwards = self.section.zero_stage == 3
        if self.section.zero_stage == 3 and config.model.cross_entropy == "fused":
            raise DareError(
                "model.cross_entropy=fused reads the output head outside the module's "
                "forward, where ZeRO-3 keeps it partitioned; use model.cross_entropy=naive "
                "(or auto) with deepspeed.zero_stage=3, or zero_stage 1 or 2"
            )
        group = ProcessGroup(config)
        super().__init__(config, group.device, group=group)
        try:
            self.ds_config = deepspeed_config(
                self.section, config.trainer, self.precision, self.world_size, self.device.type
            )
            self.deepspeed = import_deepspeed(self.device)
            backend = dist.get_backend()
            console_quiet(lambda: self.deepspeed.init_distributed(dist_backend=backend))
        except BaseException:
            super().close()
            raise
        #: the DeepSpeed engine of the policy (built by setup_optimizer)
        self.ds: Any = None
        #: inference-only DeepSpeed engines partitioning frozen copies (ZeRO-3 references)
        self.frozen: list[Any] = []
        self.clip = float(config.trainer.grad_clip)

    @classmethod
    def precisions(cls) -> tuple[str, ...]:
        return ("fp32", "bf16-mixed")

    # -- models -------------------------------------------------------------------------------
    def prepare(self, wrapper: Any, *, trainable: bool) -> None:
        super().prepare(wrapper, trainable=trainable)
        if trainable and self.section.zero_stage == 3 and getattr(wrapper, "fused_ce", False):
            wrapper.fused_ce = False
            paths = getattr(wrapper, "training_paths", None)
            if paths is not None and attrs.has(type(paths)):
                wrapper.training_paths = attrs.evolve(paths, fused_ce=False)
            if self.is_main:
                info(
                    "deepspeed ZeRO-3: training cross entropy runs naive (full logits): the fused "
                    "path reads the partitioned output head outside the module's forward"
                )

    def reference(self, wrapper: Any) -> Any:
        if self.ds is not None:
            raise DareError(
                "engine.name=deepspeed copies the reference policy before setup_optimizer "
                "(the core's workflows do); a workflow asked for it afterwards"
            )
        ref = super().reference(wrapper)
        if self.precision == "bf16-mixed":  # computed like the policy: bf16 parameters
            cast_for_precision(ref.module, "bf16", trainable=True)
        if self.section.zero_stage == 3:
            config = {k: v for k, v in self.ds_config.items() if k != "optimizer"}
            engine, *_ = self.deepspeed.initialize(model=ref.module, config=copy.deepcopy(config))
            self.frozen.append(engine)
        return ref

    def autocast(self) -> Any:
        # DeepSpeed casts the modules it wraps (bf16-mixed: bf16 parameters); a module not yet
        # wrapped (inference-only runs) computes under the policy's autocast
        return contextlib.nullcontext() if self.ds is not None else super().autocast()

    # -- optimisation -------------------------------------------------------------------------
    def setup_optimizer(self, wrapper: Any, trainer: Any) -> None:
        self.module = wrapper.module
        self.params = trainable_parameters(wrapper.module)
        # the trainer's AdamW unless the config names DeepSpeed's (CPU Adam with offloading)
        client = None if "optimizer" in self.ds_config else adamw(self.params, trainer)
        self.ds, self.optimizer, _, _ = self.deepspeed.initialize(
            model=wrapper.module, optimizer=client, model_parameters=self.params, config=copy.deepcopy(self.ds_config)
        )
        self.clip = float(trainer.grad_clip)

    def backward(self, loss: torch.Tensor) -> None:
        # what DeepSpeed's forward arranges for the backward of its output: a new micro-step of
        # the ZeRO optimizer (accumulate into, not overwrite, the step's gradient partitions) and
        # the backward prologue (accumulation-boundary flag, hook state)
        start = getattr(self.ds.optimizer, "clear_backward_seen_flag", None)
        if start is not None:
            start()
        self.ds._backward_prologue()
        with self._external_parameters():
            self.ds.backward(loss)

    def _external_parameters(self) -> Any:
        """ZeRO-3: the parameters a module's forward read from a child module without calling it
        (DeepSpeed finds them while the module runs: ``ds_external_parameters``), gathered for the
        backward. DeepSpeed re-gathers them through hooks on the module's outputs, which it cannot
        attach to outputs other than tensors, tuples and dicts (HF ``ModelOutput`` is a dict)."""
        if self.section.zero_stage != 3:
            return contextlib.nullcontext()
        params = [
            p
            for m in self.module.modules()
            if hasattr(m, "ds_external_parameters")
            for _, p in m.ds_external_parameters()
            if not getattr(p, "ds_persist", False)
        ]
        return self.deepspeed.zero.GatheredParameters(params) if params else contextlib.nullcontext()

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        if float(max_norm) != self.clip:
            self.ds.optimizer.clip_grad = float(max_norm)
            self.clip = float(max_norm)
        set_lr(self.ds.optimizer, lr)
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        return (float("nan") if norm is None else float(norm)), bool(self.ds.was_step_applied())

    def memory(self) -> dict[str, int]:
        """This rank's bytes: its parameter partitions (ZeRO-3 ``ds_tensor``, else the module's
        tensors), the ZeRO optimizer's gradient partitions, and its optimizer state: the fp32
        master partitions and the moments of the optimizer that steps them."""

        def size(*objs: Any) -> int:
            total = 0
            for obj in objs:
                if isinstance(obj, torch.Tensor):
                    total += obj.numel() * obj.element_size()
                elif isinstance(obj, dict):
                    total += size(*obj.values())
                elif isinstance(obj, (list, tuple)):
                    total += size(*obj)
            return total

        params = sum(size(getattr(p, "ds_tensor", p.data)) for p in self.module.parameters())
        zero = self.ds.optimizer if self.ds is not None else None
        masters = [getattr(zero, n, None) for n in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")]
        grads = [
            getattr(zero, n, None)
            for n in (
                "averaged_gradients",
                "grads_in_partition",
                "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
            )
        ]
        inner = getattr(zero, "optimizer", None)
        state = list(inner.state.values()) if inner is not None else []
        return {
            "parameters": params,
            "gradients": size(*[g for g in grads if g is not None]),
            "optimizer": size(*[m for m in masters if m is not None], *state),
        }

    # -- state --------------------------------------------------------------------------------
    def save_state(self, path: str) -> None:
        self.ds.save_checkpoint(path, tag=TAG, save_latest=False, exclude_frozen_parameters=True)

    def load_state(self, path: str) -> None:
        loaded, _ = self.ds.load_checkpoint(
            path, tag=TAG, load_module_strict=False, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if loaded is None:
            raise DareError(f"{path} holds no DeepSpeed checkpoint (tag {TAG!r}); it was written by another engine")

    def full_state_dict(self, wrapper: Any) -> Optional[dict[str, torch.Tensor]]:
        if self.ds is None or (self.precision == "fp32" and self.section.zero_stage < 3):
            return None  # every rank holds the whole module in fp32: the module is the state
        from deepspeed.utils import safe_get_full_fp32_param

        out: dict[str, torch.Tensor] = {}
        done: dict[int, torch.Tensor] = {}
        for name, tensor in wrapper.module.state_dict(keep_vars=True).items():
            if id(tensor) not in done:  # tied weights: gathered once
                full = None
                if isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad:
                    full = safe_get_full_fp32_param(tensor)  # the fp32 master (collective)
                if full is None and hasattr(tensor, "ds_id"):  # a partitioned frozen parameter
                    with self.deepspeed.zero.GatheredParameters([tensor]):
                        full = tensor.detach().clone()
                done[id(tensor)] = (tensor if full is None else full).detach().cpu().clone()
            out[name] = done[id(tensor)]
        return out if self.is_main else None

    def close(self) -> None:
        for engine in [self.ds, *self.frozen]:
            if engine is not None:
                engine.destroy()
        self.ds, self.frozen = None, []
        if self.group.owns and dist.is_initialized():
            # the world group and DeepSpeed's own references to it (a later run builds new ones)
            self.deepspeed.comm.destroy_process_group()
        super().close()


def build(config: Any) -> DeepSpeedEngine:
    return DeepSpeedEngine(config)
