"""Document (variable-length) attention for packed rows: the kernels there are, which run on a
device, and the mask object that carries the choice to a model. The kernels themselves are part of
the nn toolkit (``dare_nn.attention.document_attention``). Every kernel computes, for packed rows with per-slot document ids ``doc_ids`` ``[R, L]``,
softmax attention of each query over the keys of its own document only (bidirectional):

* ``sdpa_mask`` — ``scaled_dot_product_attention`` with a boolean block-diagonal mask; runs on
  every device, and is the only one that runs (forward and backward) on CPU;
* ``flex`` — FlexAttention with a ``BlockMask`` built from the document ids (CUDA only:
  FlexAttention's backward is not supported on CPU);
* ``varlen`` — torch's own ``varlen_attn`` over the flattened rows with ``cu_seqlens`` (CUDA);
* ``flash_attn`` — ``flash_attn_varlen_func`` from the flash-attn package (CUDA, only when the
  package is importable).

``varlen`` and ``flash_attn`` are FlashAttention kernels: half precision (bf16 / fp16) only, head
dimension padded with zeros to a multiple of 8. FlexAttention runs compiled (``torch.compile``;
eager FlexAttention materialises the scores), with the packed width padded to a multiple of its
128-slot block so that few shapes are compiled, and head dimensions below 16 padded to 16 (zero
padding changes neither the scores nor the output; the scale is the unpadded one).

A model receives a kernel as a :class:`DocumentMask` in place of its attention mask (the shared
layers of the nn toolkit (``dare-nn``) dispatch on it). What every layer of one forward (and its
backward) shares — FlexAttention's ``BlockMask``, the ``cu_seqlens`` of the varlen kernels — is
built once per mask, at the first layer, and kept on it.

:func:`available_kernels` lists the ones that can run on a device and dtype, the default first.
``sdpa_mask`` is the default everywhere: on an H200 (a 1B-parameter random checkpoint, 8 sequences of
96–576 tokens) it was the fastest packed kernel in bf16 and fp32 (``docs/benchmarks.md``; that
benchmark rebuilt the other kernels' per-forward set-up in every layer). On CPU only ``sdpa_mask``
runs; the CUDA kernels are tested by ``libs/dare-nn/tests/test_cuda_kernels.py`` (skipped without a GPU).
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import attrs
import torch

KERNELS = ("sdpa_mask", "flash_attn", "varlen", "flex")
HALF = (torch.float16, torch.bfloat16)
FLEX_BLOCK = 128


@attrs.frozen(eq=False)
class DocumentMask:
    """Attention of packed rows restricted to documents, to be run by ``kernel``.

    Passed to a model as its ``attention_mask`` in place of a 4-D boolean mask: ``doc_ids``
    ``[R, L]`` is the document of each slot (``-1`` on filler slots, which attend only to
    themselves), ``kernel`` one of :data:`KERNELS`.
    """

    doc_ids: torch.Tensor
    kernel: str = "sdpa_mask"
    #: per-forward set-up shared by the layers (block mask, cu_seqlens), filled by the first layer
    cache: dict = attrs.field(factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown document attention kernel {self.kernel!r}; valid: {KERNELS}")
        if self.doc_ids.dim() != 2:
            raise ValueError(f"doc_ids must be [rows, length], got {tuple(self.doc_ids.shape)}")

    def to(self, device) -> "DocumentMask":
        """The same mask with ``doc_ids`` on ``device`` (like ``Tensor.to`` for a mask)."""
        return DocumentMask(self.doc_ids.to(device), self.kernel)


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[R, 1, L, L]``: same document, filler (``-1``) slots attend only to themselves."""
    same = (doc_ids[:, :, None] == doc_ids[:, None, :]) & (doc_ids >= 0)[:, :, None]
    eye = torch.eye(doc_ids.shape[1], dtype=torch.bool, device=doc_ids.device)[None]
    return (same | (eye & (doc_ids < 0)[:, :, None]))[:, None]


def _flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


def _varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


def flash_attn_importable() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def available_kernels(device: torch.device | str, dtype: Optional[torch.dtype] = None) -> tuple[str, ...]:
    """Kernels that can run forward and backward on ``device`` for inputs of ``dtype`` (``None``:
    any dtype), the default (``sdpa_mask``) first."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return ("sdpa_mask",)
    found = ["sdpa_mask"]
    half = dtype is None or dtype in HALF
    if half and flash_attn_importable():
        found.append("flash_attn")
    if half and _varlen_available():
        found.append("varlen")
    if _flex_available():
        found.append("flex")
    return tuple(found)


def cu_seqlens(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    rows, width = doc_ids.shape
    flat = doc_ids.reshape(-1)
    slot = torch.arange(width, device=flat.device).repeat(rows)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = (flat[1:] != flat[:-1]) | (slot[1:] == 0) | (flat[1:] < 0)
    idx = torch.nonzero(starts).flatten()
    cu = torch.cat([idx, idx.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())
