"""Document (variable-length) attention kernels for packed rows, chosen per device.

Every kernel computes, for packed rows with per-slot document ids ``doc_ids`` ``[R, L]``,
softmax attention of each query over the keys of its own document only (bidirectional):

* ``sdpa_mask`` — ``scaled_dot_product_attention`` with a boolean block-diagonal mask; runs on
  every device, and is the only one that runs (forward and backward) on CPU;
* ``flex`` — FlexAttention with a ``BlockMask`` built from the document ids (CUDA only:
  FlexAttention's backward is not supported on CPU);
* ``varlen`` — torch's own ``varlen_attn`` over the flattened rows with ``cu_seqlens`` (CUDA);
* ``flash_attn`` — ``flash_attn_varlen_func`` from the flash-attn package (CUDA, only when the
  package is importable).

:func:`available_kernels` lists the ones that can run on a device, best first. Only ``sdpa_mask``
is exercised by the tests on this CPU machine; the CUDA kernels are untested here.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch
import torch.nn.functional as F


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


def available_kernels(device: torch.device | str) -> tuple[str, ...]:
    """Kernels that can run forward and backward on ``device``, best first."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return ("sdpa_mask",)
    found = []
    if flash_attn_importable():
        found.append("flash_attn")
    if _varlen_available():
        found.append("varlen")
    if _flex_available():
        found.append("flex")
    found.append("sdpa_mask")
    return tuple(found)


def _cu_seqlens(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    rows, width = doc_ids.shape
    flat = doc_ids.reshape(-1)
    slot = torch.arange(width, device=flat.device).repeat(rows)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = (flat[1:] != flat[:-1]) | (slot[1:] == 0) | (flat[1:] < 0)
    idx = torch.nonzero(starts).flatten()
    cu = torch.cat([idx, idx.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor,
                       scale: Optional[float] = None, kernel: str = "sdpa_mask") -> torch.Tensor:
    """Attention within documents. ``q``/``k``/``v`` ``[R, H, L, hd]`` (same head count),
    ``doc_ids`` ``[R, L]`` → ``[R, H, L, hd]``."""
    if kernel == "sdpa_mask":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(doc_ids), scale=scale)
    if q.device.type != "cuda":
        raise ValueError(f"document attention kernel {kernel!r} runs only on CUDA; use sdpa_mask")
    if kernel == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def same_doc(b, h, qi, ki):
            return (doc_ids[b, qi] == doc_ids[b, ki]) & ((doc_ids[b, qi] >= 0) | (qi == ki))

        rows, width = doc_ids.shape
        block = create_block_mask(same_doc, rows, None, width, width, device=q.device)
        return flex_attention(q, k, v, block_mask=block, scale=scale)
    rows, heads, width, dim = q.shape
    cu, longest = _cu_seqlens(doc_ids)
    flat = [t.transpose(1, 2).reshape(rows * width, t.shape[1], dim) for t in (q, k, v)]
    if kernel == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(flat[0], flat[1], flat[2], cu, cu, longest, longest, scale=scale)
    elif kernel == "flash_attn":
        from flash_attn import flash_attn_varlen_func

        out = flash_attn_varlen_func(flat[0], flat[1], flat[2], cu, cu, longest, longest,
                                     softmax_scale=scale, causal=False)
    else:
        raise ValueError(f"unknown document attention kernel {kernel!r}; valid: {available_kernels(q.device)}")
    return out.reshape(rows, width, heads, dim).transpose(1, 2)
