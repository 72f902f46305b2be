"""Choosing the training paths of a model wrapper from what it can do and the device (not from
the rollout backend):

* **attention** — ``packed`` (a micro-batch's valid tokens packed into rows with a document mask
  and per-document position ids, no padding computed) when the wrapper supports it, else ``padded``;
* **cross entropy** — ``fused`` (chunked, logits-free; :mod:`dare_core.ops.fused_ce`) when the
  native module exposes ``forward_hidden`` and ``get_output_embeddings``, else ``naive``;
* **attention kernel** of the packed path — one of :func:`dare_core.ops.attention.available_kernels`
  for the device and the model's dtype (described there).

``auto`` picks the accelerated path wherever it is supported; ``packed`` / ``padded``, ``fused`` /
``naive`` and a kernel name force one, and forcing an unsupported path is a one-line error.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from dare_core.errors import DareError
from dare_core.ops.attention import KERNELS, available_kernels

TRAIN_ATTENTION_CHOICES = ("auto", "padded", "packed")
CROSS_ENTROPY_CHOICES = ("auto", "fused", "naive")
ATTENTION_KERNEL_CHOICES = ("auto",) + KERNELS
_KERNEL_WORDS = {
    "sdpa_mask": "block-diagonal document mask as a 4-D boolean mask through SDPA",
    "flex": "FlexAttention with a document BlockMask",
    "varlen": "torch varlen_attn over cu_seqlens",
    "flash_attn": "flash-attn varlen over cu_seqlens",
}


@attrs.frozen
class TrainingPaths:
    """The resolved training paths (what ran), for the run log."""

    attention: str
    attention_kernel: str
    fused_ce: bool
    device: str
    requested_attention: str = "auto"
    requested_cross_entropy: str = "auto"
    requested_kernel: str = "auto"

    def describe(self) -> str:
        if self.attention == "packed":
            att = (
                f"packed (kernel {self.attention_kernel}: {_KERNEL_WORDS[self.attention_kernel]}, "
                f"per-document positions, on {self.device}) [kernel requested {self.requested_kernel}]"
            )
        else:
            att = f"padded (key-padding mask on {self.device})"
        ce = "fused (chunked, no [N, V] logits)" if self.fused_ce else "naive (full logits)"
        return (
            f"training paths: attention={att} [requested {self.requested_attention}]; "
            f"cross entropy={ce} [requested {self.requested_cross_entropy}]"
        )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def param_dtype(wrapper: Any):
    """The dtype of the wrapper's (first) parameters, or ``None`` when it has none."""
    try:
        return next(wrapper.module.parameters()).dtype
    except (AttributeError, StopIteration, TypeError):
        return None


def select_training_paths(
    wrapper: Any,
    train_attention: str = "auto",
    cross_entropy: str = "auto",
    device: Any = None,
    attention_kernel: str = "auto",
) -> TrainingPaths:
    """Resolve ``auto`` / forced choices against the wrapper's capabilities, the device and the
    model's dtype."""
    for key, value, choices in (
        ("train_attention", train_attention, TRAIN_ATTENTION_CHOICES),
        ("cross_entropy", cross_entropy, CROSS_ENTROPY_CHOICES),
        ("attention_kernel", attention_kernel, ATTENTION_KERNEL_CHOICES),
    ):
        if value not in choices:
            raise DareError(f"model.{key}={value!r} is not one of {', '.join(choices)}; pick one of them")
    name = getattr(wrapper, "family", type(wrapper).__name__)
    can_pack = bool(wrapper.supports_packing())
    can_fuse = bool(wrapper.supports_fused_ce())
    if train_attention == "packed" and not can_pack:
        raise DareError(
            f"model.train_attention=packed but the {name!r} wrapper cannot pack sequences (it needs "
            f"the packed_varlen capability and a layout that packs: the masked-diffusion one or "
            f"the block-diffusion BD3LM one); use model.train_attention=padded or auto"
        )
    if cross_entropy == "fused" and not can_fuse:
        raise DareError(
            f"model.cross_entropy=fused but the {name!r} model has no forward_hidden/get_output_embeddings "
            f"(or its wrapper changes the training layout without denoise_hidden); use "
            f"model.cross_entropy=naive or auto"
        )
    dev = torch.device(device) if device is not None else getattr(wrapper, "device", torch.device("cpu"))
    attention = "packed" if (train_attention == "packed" or (train_attention == "auto" and can_pack)) else "padded"
    kernel = "-"
    if attention == "packed":
        dtype = param_dtype(wrapper)
        runnable = available_kernels(dev, dtype)
        kernel = runnable[0] if attention_kernel == "auto" else attention_kernel
        if kernel not in runnable:
            raise DareError(
                f"model.attention_kernel={attention_kernel} cannot run on {dev.type} with "
                f"{str(dtype).replace('torch.', '')} weights; runnable here: "
                f"{', '.join(runnable)} (or auto)"
            )
    elif attention_kernel != "auto":
        raise DareError(
            f"model.attention_kernel={attention_kernel} applies to the packed training path, "
            f"but {name!r} trains padded here; drop model.attention_kernel or use "
            f"model.train_attention=packed"
        )
    fused = cross_entropy == "fused" or (cross_entropy == "auto" and can_fuse)
    return TrainingPaths(attention, kernel, fused, dev.type, train_attention, cross_entropy, attention_kernel)


def configure_training_paths(
    wrapper: Any,
    train_attention: str = "auto",
    cross_entropy: str = "auto",
    device: Any = None,
    attention_kernel: str = "auto",
) -> TrainingPaths:
    """Select the paths and set them on the wrapper (``wrapper.train_attention``,
    ``wrapper.attention_kernel``, ``wrapper.fused_ce``); returns what was chosen."""
    paths = select_training_paths(wrapper, train_attention, cross_entropy, device, attention_kernel)
    wrapper.train_attention = paths.attention
    if paths.attention == "packed":
        wrapper.attention_kernel = paths.attention_kernel
    wrapper.fused_ce = paths.fused_ce
    wrapper.training_paths = paths
    return paths
