"""Document attention kernels over packed rows (see :mod:`dare_core.ops.attention` for what each
kernel computes, which run where, and how a :class:`~dare_core.ops.attention.DocumentMask`
carries the choice): SDPA with a block-diagonal mask, FlexAttention, torch's ``varlen_attn`` and
flash-attn's ``flash_attn_varlen_func``."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from dare_core.api import FLEX_BLOCK, HALF, available_kernels, cu_seqlens, document_mask

_COMPILED_FLEX = None


def _flex_document_attention(q, k, v, doc_ids, scale, cache):
    """FlexAttention, compiled once per process, over rows padded to a multiple of its block; the
    ``BlockMask`` is built once per ``cache`` (one forward)."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    rows, width = doc_ids.shape
    pad = (-width) % FLEX_BLOCK
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    if "block_mask" not in cache:
        docs = F.pad(doc_ids, (0, pad), value=-1) if pad else doc_ids

        def same_doc(b, h, qi, ki):
            return (docs[b, qi] == docs[b, ki]) & ((docs[b, qi] >= 0) | (qi == ki))

        size = width + pad
        cache["block_mask"] = create_block_mask(same_doc, rows, None, size, size, device=q.device)
    return _COMPILED_FLEX(q, k, v, block_mask=cache["block_mask"], scale=scale)[:, :, :width]


def _pad_head_dim(q, k, v, dim: int):
    """Zero-pad the last dimension of ``q``/``k``/``v`` to ``dim`` (scores and outputs unchanged)."""
    extra = dim - q.shape[-1]
    if extra <= 0:
        return q, k, v
    return tuple(F.pad(t, (0, extra)) for t in (q, k, v))


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc_ids: torch.Tensor,
    scale: Optional[float] = None,
    kernel: str = "sdpa_mask",
    cache: Optional[dict] = None,
) -> torch.Tensor:
    """Attention within documents. ``q``/``k``/``v`` ``[R, H, L, hd]`` (same head count),
    ``doc_ids`` ``[R, L]`` → ``[R, H, L, hd]``. ``cache``: a dict shared by the calls of one
    forward (every layer sees the same ``doc_ids``), holding the kernel's set-up."""
    cache = {} if cache is None else cache
    if kernel == "sdpa_mask":
        if "bool_mask" not in cache:
            cache["bool_mask"] = document_mask(doc_ids)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=cache["bool_mask"], scale=scale)
    if q.device.type != "cuda":
        raise ValueError(f"document attention kernel {kernel!r} runs only on CUDA; use sdpa_mask")
    dim = q.shape[-1]
    scale = dim**-0.5 if scale is None else scale
    if kernel == "flex":
        q, k, v = _pad_head_dim(q, k, v, max(16, dim))
        return _flex_document_attention(q, k, v, doc_ids, scale, cache)[..., :dim]
    if kernel in ("varlen", "flash_attn") and q.dtype not in HALF:
        raise ValueError(
            f"document attention kernel {kernel!r} needs bf16 or fp16 inputs, got {q.dtype}; "
            f"use flex or sdpa_mask for {q.dtype}"
        )
    q, k, v = _pad_head_dim(q, k, v, -(-dim // 8) * 8)
    padded = q.shape[-1]
    rows, heads, width, _ = q.shape
    if "cu_seqlens" not in cache:
        cache["cu_seqlens"] = cu_seqlens(doc_ids)
    cu, longest = cache["cu_seqlens"]
    flat = [t.transpose(1, 2).reshape(rows * width, t.shape[1], padded) for t in (q, k, v)]
    if kernel == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(flat[0], flat[1], flat[2], cu, cu, longest, longest, scale=scale)
    elif kernel == "flash_attn":
        from flash_attn import flash_attn_varlen_func

        out = flash_attn_varlen_func(
            flat[0], flat[1], flat[2], cu, cu, longest, longest, softmax_scale=scale, causal=False
        )
    else:
        raise ValueError(f"unknown document attention kernel {kernel!r}; valid: {available_kernels(q.device)}")
    return out.reshape(rows, width, heads, padded).transpose(1, 2)[..., :dim]
