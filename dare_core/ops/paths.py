"""Choosing the training attention path and the cross-entropy head for a model wrapper.

Training and rollout run different attention paths; this module picks the training ones from
what the wrapper can do and the device, independently of the rollout backend:

* **attention** — ``packed`` (valid tokens of a micro-batch packed into rows with a document
  mask and per-document position ids, no padding computed) when the wrapper supports it, else
  ``padded``;
* **cross entropy** — ``fused`` (chunked, logits-free; :mod:`dare_core.ops.fused_ce`) when the
  native module exposes ``forward_hidden`` and ``get_output_embeddings``, else ``naive``.

``auto`` picks the accelerated path wherever it is supported; ``packed`` / ``padded`` and
``fused`` / ``naive`` force one, and forcing an unsupported path is a one-line error.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from dare_core.errors import DareError

TRAIN_ATTENTION_CHOICES = ("auto", "padded", "packed")
CROSS_ENTROPY_CHOICES = ("auto", "fused", "naive")


@attrs.frozen
class TrainingPaths:
    """The resolved training paths (what ran), for the run log."""

    attention: str
    attention_kernel: str
    fused_ce: bool
    device: str
    requested_attention: str = "auto"
    requested_cross_entropy: str = "auto"

    def describe(self) -> str:
        if self.attention == "packed":
            att = (f"packed (block-diagonal document mask as a 4-D boolean mask through the model's "
                   f"attention, per-document positions, on {self.device})")
        else:
            att = f"padded (key-padding mask on {self.device})"
        ce = "fused (chunked, no [N, V] logits)" if self.fused_ce else "naive (full logits)"
        return (f"training paths: attention={att} [requested {self.requested_attention}]; "
                f"cross entropy={ce} [requested {self.requested_cross_entropy}]")

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _supports(wrapper: Any, name: str) -> bool:
    fn = getattr(wrapper, name, None)
    return bool(fn()) if callable(fn) else False


def select_training_paths(wrapper: Any, train_attention: str = "auto", cross_entropy: str = "auto",
                          device: Any = None) -> TrainingPaths:
    """Resolve ``auto`` / forced choices against the wrapper's capabilities and the device."""
    if train_attention not in TRAIN_ATTENTION_CHOICES:
        raise DareError(f"model.train_attention={train_attention!r} is not one of "
                        f"{', '.join(TRAIN_ATTENTION_CHOICES)}; pick one of them")
    if cross_entropy not in CROSS_ENTROPY_CHOICES:
        raise DareError(f"model.cross_entropy={cross_entropy!r} is not one of "
                        f"{', '.join(CROSS_ENTROPY_CHOICES)}; pick one of them")
    name = getattr(wrapper, "family", type(wrapper).__name__)
    can_pack = _supports(wrapper, "supports_packing")
    can_fuse = _supports(wrapper, "supports_fused_ce")
    if train_attention == "packed" and not can_pack:
        raise DareError(
            f"model.train_attention=packed but the {name!r} wrapper cannot pack sequences (it needs "
            f"the packed_varlen capability, a masked-diffusion layout and a module taking "
            f"position_ids and 4-D boolean masks); use model.train_attention=padded or auto")
    if cross_entropy == "fused" and not can_fuse:
        raise DareError(
            f"model.cross_entropy=fused but the {name!r} model has no forward_hidden/get_output_embeddings "
            f"(or its wrapper changes the training layout without denoise_hidden); use "
            f"model.cross_entropy=naive or auto")
    dev = torch.device(device) if device is not None else getattr(wrapper, "device", torch.device("cpu"))
    attention = "packed" if (train_attention == "packed" or (train_attention == "auto" and can_pack)) else "padded"
    # the native modules take the document mask as a 4-D boolean mask through their own attention
    # implementation (SDPA with a boolean mask by default); the CUDA document kernels of
    # dare_core.ops.attention (FlexAttention, varlen, flash-attn) need a module that takes document
    # ids, which no family module does yet, so they are never selected here
    kernel = "bool_mask" if attention == "packed" else "-"
    fused = cross_entropy == "fused" or (cross_entropy == "auto" and can_fuse)
    return TrainingPaths(attention, kernel, fused, dev.type, train_attention, cross_entropy)


def configure_training_paths(wrapper: Any, train_attention: str = "auto", cross_entropy: str = "auto",
                             device: Any = None) -> TrainingPaths:
    """Select the paths and set them on the wrapper (``wrapper.train_attention``,
    ``wrapper.fused_ce``); returns what was chosen."""
    paths = select_training_paths(wrapper, train_attention, cross_entropy, device)
    wrapper.train_attention = paths.attention
    wrapper.fused_ce = paths.fused_ce
    wrapper.training_paths = paths
    return paths
