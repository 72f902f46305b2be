"""The document-attention contract of the packed training path: what the core hands a model and
which kernels it may ask for. A packed row holds several documents; ``doc_ids`` ``[R, L]`` names
the document of each slot (``-1`` on filler slots), and every query attends bidirectionally to the
keys of its own document only (a filler slot to itself).

* :class:`DocumentMask` — a model's ``attention_mask`` in place of a 4-D boolean mask: the
  ``doc_ids`` and the kernel to run (:data:`KERNELS`), with a per-forward cache for its set-up;
* :func:`document_mask` — the same attention as a boolean ``[R, 1, L, L]`` mask (what the
  ``sdpa_mask`` kernel and the packing plan's plain mask use); :func:`cu_seqlens` — the
  document boundaries of the row-major flattening (what the varlen kernels read);
* :func:`available_kernels` — the kernels that run on a device for a dtype, the default
  (``sdpa_mask``, every device) first; the training-path selection (:mod:`dare_core.ops.paths`)
  picks among them.

The kernels themselves belong to the models: the nn toolkit families build on implements every
name of :data:`KERNELS` (``dare_nn.attention.document_attention``, ``libs/dare-nn``).
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import attrs
import torch

KERNELS = ("sdpa_mask", "flash_attn", "varlen", "flex")
#: the dtypes of the varlen kernels (``varlen``, ``flash_attn``)
HALF = (torch.float16, torch.bfloat16)


@attrs.frozen(eq=False)
class DocumentMask:
    """Attention of packed rows restricted to documents, run by ``kernel`` (one of :data:`KERNELS`);
    a model's ``attention_mask`` in place of a 4-D boolean mask. ``doc_ids`` ``[R, L]`` is the
    document of each slot (``-1`` on filler slots, which attend only to themselves)."""

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


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported (flash-attn; torch's FlexAttention and varlen attention
    are recent additions)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # pragma: no cover (a parent package missing)
        return False


def available_kernels(device: torch.device | str, dtype: Optional[torch.dtype] = None) -> tuple[str, ...]:
    """Kernels that can run forward and backward on ``device`` for inputs of ``dtype`` (``None``:
    any dtype), the default (``sdpa_mask``) first."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return ("sdpa_mask",)
    found = ["sdpa_mask"]
    half = dtype is None or dtype in HALF
    if half and _importable("flash_attn"):
        found.append("flash_attn")
    if half and _importable("torch.nn.attention.varlen"):
        found.append("varlen")
    if _importable("torch.nn.attention.flex_attention"):
        found.append("flex")
    return tuple(found)


def cu_seqlens(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(cu, longest)``: int32 ``[n + 1]`` start offsets of the ``n`` documents (each filler slot
    one of its own) in the row-major flattening of ``doc_ids`` ``[R, L]``, then the total; and
    the longest document's length."""
    rows, width = doc_ids.shape
    flat = doc_ids.reshape(-1)
    slot = torch.arange(width, device=flat.device).repeat(rows)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = (flat[1:] != flat[:-1]) | (slot[1:] == 0) | (flat[1:] < 0)
    idx = torch.nonzero(starts).flatten()
    cu = torch.cat([idx, idx.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())
