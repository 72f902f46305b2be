"""Logits-free cross entropy: per-token ``log p(target)`` from hidden states and the head weight.

For hidden states ``h`` ``[N, D]``, the output head ``W`` ``[V, D]`` (optional bias ``b`` ``[V]``,
optional logit multiplier ``s``) and targets ``y`` ``[N]``::

    z_n = s * (h_n W^T + b)                (in the input dtype, as the model's own head would)
    log p_n = z_n[y_n] - logsumexp(z_n)    (float32)

:class:`ChunkedTokenLogProb` computes this ``chunk`` rows at a time and keeps only the float32
log-sum-exp per row for the backward pass, which recomputes each chunk's logits; so neither the
forward nor the backward holds more than ``chunk x V`` logits at once (never ``[N, V]``). The
gradients with respect to ``h``, ``W`` and ``b`` are accumulated in float32 and cast back to
the parameter dtype. Any weighting of the per-token values (``-log p / p_mask``, advantages,
masks) is applied by the caller and reaches the backward as the incoming gradient, so a
diffusion cross entropy is ``(-fused_token_logprobs(...) / p_mask * mask).sum()``.
"""

from __future__ import annotations

from typing import Optional

import torch

#: default bound on the number of logits one chunk holds (rows x vocabulary), 2**24 = 64 MiB fp32
DEFAULT_CHUNK_ELEMENTS = 1 << 24


def chunk_rows(vocab: int, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one logits block holds at most ``chunk_elements`` values."""
    return max(1, int(chunk_elements) // max(1, int(vocab)))


def _logits_block(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    z = (h @ weight.t() if bias is None else h @ weight.t() + bias).float()
    return z * scale if scale != 1.0 else z


class ChunkedTokenLogProb(torch.autograd.Function):
    """``log softmax(s * (h W^T + b))[y]`` per row, chunked over rows (see module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, scale):
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            z = _logits_block(hidden[start:stop], weight, bias, scale)
            lse[start:stop] = torch.logsumexp(z, dim=-1)
            out[start:stop] = z.gather(-1, targets[start:stop, None]).squeeze(-1) - lse[start:stop]
            del z
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), targets, lse)
        ctx.has_bias, ctx.chunk, ctx.scale = bias is not None, chunk, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = (
            torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if (need_b and bias is not None) else None
        )
        grad_out = grad_out.float()
        n = hidden.shape[0]
        for start in range(0, n, ctx.chunk):
            stop = min(n, start + ctx.chunk)
            h = hidden[start:stop]
            z = _logits_block(h, weight, bias, ctx.scale)
            g = grad_out[start:stop]
            # d logp / d z = onehot(y) - softmax(z); times the incoming gradient (in place on z)
            z.sub_(lse[start:stop, None]).exp_().mul_(-g[:, None])
            z.scatter_add_(-1, targets[start:stop, None], g[:, None])
            if ctx.scale != 1.0:
                z.mul_(ctx.scale)  # dz/d(hW^T + b) = s
            if grad_h is not None:
                grad_h[start:stop] = (z.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(z.t(), h.float())
            if grad_b is not None:
                grad_b.add_(z.sum(0))
            del z
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
        )


def fused_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    scale: float = 1.0,
    chunk: Optional[int] = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Per-token ``log p(target)`` in float32 without ``[N, V]`` logits: ``hidden`` ``[..., D]``,
    ``targets`` ``[...]`` (long), ``weight`` ``[V, D]``, ``bias`` ``[V]`` → ``[...]``; ``chunk`` rows
    per block (default: from ``chunk_elements``)."""
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"hidden size {hidden.shape[-1]} does not match the head's {weight.shape[-1]}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets {tuple(targets.shape)} do not match hidden {tuple(hidden.shape)}")
    if targets.numel() == 0:
        return hidden.new_zeros(targets.shape, dtype=torch.float32)
    rows = int(chunk) if chunk else chunk_rows(weight.shape[0], chunk_elements)
    if rows < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out = ChunkedTokenLogProb.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1).long(), rows, float(scale)
    )
    return out.reshape(targets.shape)


def naive_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    scale: float = 1.0,
) -> torch.Tensor:
    """The reference form: full ``[N, V]`` logits, float32 ``log_softmax``, gather."""
    return (
        torch.log_softmax(_logits_block(hidden, weight, bias, scale), dim=-1)
        .gather(-1, targets.long()[..., None])
        .squeeze(-1)
    )
