"""The document attention kernels: attention of packed rows within their documents, for a
``dare_core.api.DocumentMask`` (which names the kernel) reaching :func:`dare_nn.layers.attend`.
For packed rows with per-slot document ids ``doc_ids`` ``[R, L]`` each computes bidirectional
softmax attention of every query over the keys of its own document (a filler slot, ``-1``, over
itself):

* ``sdpa_mask`` — SDPA with the boolean block-diagonal mask (``dare_core.api.document_mask``);
  every device, the only one on CPU;
* ``flex`` — FlexAttention with a ``BlockMask`` built from the document ids, compiled (CUDA);
* ``varlen`` — torch's ``varlen_attn`` over ``cu_seqlens`` (CUDA, bf16/fp16);
* ``flash_attn`` — ``flash_attn_varlen_func`` of flash-attn (CUDA, bf16/fp16, when importable).

Which of them run on a device is ``dare_core.api.available_kernels`` (the core's training paths
choose among them). The default, ``sdpa_mask``, is the fastest packed kernel measured on an H200
in bf16 and fp32 (``docs/benchmarks.md``); the CUDA kernels are tested by
``libs/dare-nn/tests/test_cuda_kernels.py``.
"""

from __future__ import annotations

from typing import Optional, cast

import torch
import torch.nn.functional as F

from dare_core.api import HALF, available_kernels, cu_seqlens, document_mask

#: FlexAttention's block: rows are padded to a multiple of it
FLEX_BLOCK = 128
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
    return cast(torch.Tensor, out).reshape(rows, width, heads, padded).transpose(1, 2)[..., :dim]
