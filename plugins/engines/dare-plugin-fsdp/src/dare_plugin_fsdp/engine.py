"""The ``fsdp`` engine: data parallelism with sharded parameters, gradients and optimizer state.

:class:`FSDPEngine` extends the core's single-process engine, holding the core's process group
(``dare_core.api.ProcessGroup``: process group, device, collectives), with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``; the FSDP design: Zhao
et al. 2023, *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*,
arXiv:2304.11277; the API: https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html):

* loading: the workflows build the model on the meta device (:attr:`load_device`); ``prepare``
  shards it, allocates each rank's shards and reads them straight from the checkpoint's
  safetensors (``torch.distributed.checkpoint.HuggingFaceStorageReader``: each rank reads the
  slices it holds, in the dtype the precision policy gives its shards), so no rank holds the whole
  model. Under LoRA, and for checkpoints not in safetensors, the model is loaded whole, as on
  one process, and then sharded;
* every decoder layer the wrapper lists (``wrapper.decoder_layers()``) is one FSDP unit, the
  remaining parameters (embeddings, final norm, head) the root unit; every parameter becomes a
  DTensor sharded on dim 0 over a 1-D device mesh of all ranks, all-gathered per unit for its
  forward and its backward;
* gradients are reduce-scattered (averaged over ranks) by FSDP during backward, so :meth:`step`
  only clips (the total norm is reduced over the shards), steps and zeroes;
* precision: ``fp32``; ``bf16-mixed`` = fp32 sharded master weights and optimizer state, the
  gathered copies cast to bf16 (``MixedPrecisionPolicy(param_dtype=bf16)``) and the forward
  under bf16 autocast as on the other engines; ``bf16`` = bf16 shards with the compensated AdamW
  (Kahan summation);
* state: the trainable parameters' and the optimizer's shards through
  ``torch.distributed.checkpoint`` (one file per rank plus ``.metadata``); HF-layout exports are
  written by every rank from its shards (:mod:`dare_plugin_fsdp.export`), LoRA's adapters
  gathered to rank 0.
"""

from __future__ import annotations

import copy
import glob
import os
from typing import Any, Optional, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from dare_core.api import DareError, ProcessGroup, SingleProcessEngine
from dare_plugin_fsdp.config import SECTION, FSDPConfig
from dare_plugin_fsdp.export import exported_names, write_sharded

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

#: the two entries of the checkpoint :meth:`FSDPEngine.save_state` writes (its tensors are
#: named ``model.<parameter>`` and ``optimizer.<...>``)
STATE_KEYS = ("model", "optimizer")

#: methods of the native module that run a forward pass besides ``forward`` (the logits-free
#: cross entropy calls ``forward_hidden``, then multiplies with the head weight)
FORWARD_METHODS = ("forward_hidden",)


def native_module(module: torch.nn.Module) -> torch.nn.Module:
    """The model whose ``forward`` / ``forward_hidden`` the wrapper calls: the module itself, or
    under LoRA the base model inside the PEFT wrapper (which has no parameters of its own)."""
    inner = getattr(module, "get_base_model", None)
    if callable(inner) and getattr(module, "peft_config", None) is not None:
        return inner()
    return module


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters are on the meta device (no storage); buffers
    and everything else are copied. Tied parameters stay tied."""
    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        for p in module.parameters()
    }
    return copy.deepcopy(module, memo)


def safetensors_checkpoint(path: Optional[str]) -> bool:
    """Whether ``path`` is a full Hugging Face checkpoint in safetensors (``config.json`` and
    ``*.safetensors``), what :func:`fill_from_checkpoint` reads; anything else (an adapter-only
    LoRA checkpoint, ``*.bin`` or other weight files) loads whole on every rank."""
    return (
        bool(path)
        and os.path.isfile(os.path.join(path, "config.json"))
        and bool(glob.glob(os.path.join(path, "*.safetensors")))
    )


def tie_groups(module: torch.nn.Module) -> list[list[str]]:
    """The names of each parameter used under several names (tied weights), as the module holds
    them before sharding (``fully_shard`` gives each FSDP unit its own copy of a shared tensor)."""
    names: dict[int, list[str]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    return [group for group in names.values() if len(group) > 1]


def fill_from_checkpoint(module: torch.nn.Module, path: str, ties: list[list[str]]) -> None:
    """Read the checkpoint's tensors into the module's allocated shards (every rank the slices it
    holds; each copy of a tied weight the tensor saved under one of its names). Collective.

    Args:
        module: the sharded module, its shards allocated (``to_empty``), named as the checkpoint.
        path: the Hugging Face checkpoint directory (``*.safetensors``).
        ties: :func:`tie_groups` of the module before sharding.

    Raises:
        DareError: a parameter the checkpoint holds under none of its names.
    """
    reader = HuggingFaceStorageReader(path)
    saved = set(reader.read_metadata().state_dict_metadata)
    state = module.state_dict()
    source = {n: next((a for a in group if a in saved), n) for group in ties for n in group}
    missing = sorted(n for n in state if source.get(n, n) not in saved)
    if missing:
        raise DareError(
            f"checkpoint {path} has no tensor {missing[0]} (nor {len(missing) - 1} more weights "
            f"of the model its config.json describes); point model.path at the complete checkpoint"
        )
    dcp.load({n: t for n, t in state.items() if n in saved}, storage_reader=reader)
    with torch.no_grad():
        for n, t in state.items():
            if source.get(n, n) != n and t is not state[source[n]]:
                t.to_local().copy_(state[source[n]].to_local())  # the same shape, mesh and placement


def refuse_shared_layers(module: torch.nn.Module, layers: Sequence[torch.nn.Module]) -> None:
    """A one-line refusal for a model whose decoder layers share weights with another FSDP unit
    (e.g. an encoder stack over the decoder's weights): FSDP2 places a parameter in one unit."""
    prefix = {id(m): f"{n}." for n, m in module.named_modules()}
    starts = [prefix[id(layer)] for layer in layers]
    for group in tie_groups(module):
        units = {next((s for s in starts if n.startswith(s)), "the root") for n in group}
        if len(units) > 1:
            raise DareError(
                f"this model uses one weight as {' and '.join(group[:2])}, in different FSDP "
                f"units (its decoder layers are shared); engine.name=fsdp cannot shard it, use "
                f"engine.name=ddp or deepspeed"
            )


def reshard(module: torch.nn.Module) -> None:
    """Free the gathered parameters of every FSDP unit in ``module`` and register the shards
    again (the root unit keeps its gathered copy after a forward that no backward follows)."""
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


class FSDPEngine(SingleProcessEngine):
    """``engine.name=fsdp``: FSDP2 sharding over the ranks of a :class:`ProcessGroup` (see the
    module docstring). Options: the ``fsdp:`` config section (:class:`FSDPConfig`)."""

    name = "fsdp"
    collective_forwards = True  # every forward all-gathers the sharded parameters

    def __init__(self, config: Any):
        if config.engine.precision == "bf16" and config.engine.bf16_update == "stochastic":
            raise DareError(
                "engine.name=fsdp implements engine.precision=bf16 with "
                "engine.bf16_update=kahan only (stochastic rounding does not run on "
                "sharded DTensor weights); set engine.bf16_update=kahan"
            )
        self.options: FSDPConfig = config.plugin_section(SECTION, FSDPConfig)
        group = ProcessGroup(config)
        super().__init__(config, group.device, group=group)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        if not config.model.lora.enabled and safetensors_checkpoint(config.model.path):
            self.load_device = torch.device("meta")  # prepare fills the shards from the checkpoint
        self._skeleton: Optional[torch.nn.Module] = None

    # -- models -------------------------------------------------------------------------------
    def fully_shard_kwargs(self) -> dict[str, Any]:
        """The ``fully_shard`` arguments every unit shares: mesh, precision, offloading."""
        mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if self.precision == "bf16-mixed" else None,
            reduce_dtype=DTYPES[self.options.reduce_dtype],
        )
        kwargs: dict[str, Any] = dict(mesh=self.mesh, mp_policy=mp)
        if self.options.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
        return kwargs

    def shard_model(self, wrapper: Any) -> None:
        """``fully_shard`` each decoder layer of ``wrapper`` (``fsdp.reshard_after_forward``),
        then its native module: the root, whose gathered parameters FSDP keeps from its forward
        to the backward. ``forward_hidden`` is registered as a forward method of the root, so the
        head weight the logits-free cross entropy reads after it is the gathered one."""
        kwargs = self.fully_shard_kwargs()
        refuse_shared_layers(native_module(wrapper.module), wrapper.decoder_layers())
        for layer in wrapper.decoder_layers():
            fully_shard(layer, reshard_after_forward=self.options.reshard_after_forward, **kwargs)
        root = native_module(wrapper.module)
        fully_shard(root, **kwargs)
        for method in FORWARD_METHODS:
            if callable(getattr(type(root), method, None)):
                register_fsdp_forward_method(root, method)

    def prepare(self, wrapper: Any, *, trainable: bool) -> None:
        super().prepare(wrapper, trainable=trainable)  # the precision policy's master dtypes
        if trainable:  # what reference() builds its copy from (the structure before sharding)
            self._skeleton = meta_copy(wrapper.module)
        module = native_module(wrapper.module)
        loaded = not any(p.is_meta for p in module.parameters())
        ties = tie_groups(module)  # before fully_shard gives each unit its own copy
        self.shard_model(wrapper)
        if not loaded:  # built on load_device=meta: allocate this rank's shards, read them
            self.allocate(module)
            fill_from_checkpoint(module, self.config.model.path, ties)

    def allocate(self, module: torch.nn.Module) -> None:
        """Give the sharded ``module`` storage where its shards live (host memory under CPU
        offload, else the rank's device), its buffers (``to_empty`` reallocates them too) their
        values kept."""
        buffers = {n: b.clone() for n, b in module.named_buffers()}
        module.to_empty(device="cpu" if self.options.cpu_offload else self.device)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(buffers[n])

    def reference(self, wrapper: Any) -> Any:
        """A frozen copy of the policy, sharded like it: built from the module's structure
        before sharding, its shards copied from the policy's (no communication). Under
        ``bf16-mixed`` its shards are stored in bf16, the dtype its forwards gather anyway."""
        if self._skeleton is None:
            raise DareError(
                "the fsdp engine builds the reference model from the policy prepared "
                "with trainable=True; prepare the policy first"
            )
        reshard(wrapper.module)
        ref = copy.copy(wrapper)
        ref.module = copy.deepcopy(self._skeleton)
        for p in ref.module.parameters():
            p.requires_grad_(False)
            if self.precision == "bf16-mixed" and p.is_floating_point():
                p.data = p.data.to(torch.bfloat16)  # on the meta device: no storage yet
        self.shard_model(ref)
        self.allocate(ref.module)
        source = dict(wrapper.module.named_parameters())
        with torch.no_grad():
            for n, p in ref.module.named_parameters():
                p.to_local().copy_(source[n].to_local())
        ref.module.eval()
        return ref

    # -- optimisation -------------------------------------------------------------------------
    def setup_optimizer(self, wrapper: Any, trainer: Any) -> None:
        reshard(wrapper.module)  # the optimizer holds the shards, not a gathered copy
        super().setup_optimizer(wrapper, trainer)

    def step(self, max_norm: float, lr: float) -> tuple[float, bool]:
        # FSDP reduce-scattered the gradients in backward: the single-process step (clip by the
        # global norm, reduced over the shards; skip when it is not finite: the norm is the same
        # on every rank)
        norm, stepped = super().step(max_norm, lr)
        if stepped:
            reshard(self.module)  # a gathered copy left by a forward without backward is stale
        return norm, stepped

    # -- state --------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.module, self.optimizer, options=StateDictOptions(ignore_frozen_params=True))
        return dict(zip(STATE_KEYS, (model, optim)))

    def save_state(self, path: str) -> None:
        """Every rank writes its shards of the trainable parameters and of the optimizer state
        (``__<rank>_0.distcp``); rank 0 also writes the index (``.metadata``). Collective."""
        dcp.save(self._state(), checkpoint_id=path)

    def load_state(self, path: str) -> None:
        if not os.path.isfile(os.path.join(path, ".metadata")):
            raise DareError(
                f"{path} holds no torch.distributed.checkpoint state (.metadata): it "
                f"was not written by engine.name=fsdp; resume with the engine that "
                f"wrote it"
            )
        state = self._state()
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        missing = sorted(k for k in state["model"] if f"model.{k}" not in saved)
        if missing:
            raise DareError(
                f"checkpoint {path} has no {missing[0]} (nor {len(missing) - 1} more "
                f"trainable weights): the run that wrote it trained other parameters "
                f"(LoRA settings)"
            )
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            self.module,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(ignore_frozen_params=True, strict=False),
        )

    def export_weights(self, wrapper: Any, directory: str, dtype: torch.dtype) -> bool:
        """Every rank writes its shards, merged file by file (:mod:`dare_plugin_fsdp.export`),
        for a transformers model (the layout its ``save_pretrained`` writes); ``False`` for
        another module (its wrapper's ``save_pretrained`` writes it) or one this engine did not
        prepare as the policy."""
        from transformers import PreTrainedModel

        if self._skeleton is None or not isinstance(wrapper.module, PreTrainedModel):
            return False
        write_sharded(self, wrapper, exported_names(self._skeleton), directory, dtype)
        return True

    def full_state_dict(self, wrapper: Any) -> Optional[dict[str, torch.Tensor]]:
        """Every parameter and buffer gathered into CPU tensors on rank 0 (``None`` on the
        others), named as ``wrapper.module.state_dict()`` names them. Collective."""
        state = get_model_state_dict(wrapper.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_main else None


def build_fsdp(config: Any) -> FSDPEngine:
    return FSDPEngine(config)
