"""Grouped computation of mixture-of-experts SwiGLU experts (all experts in a few GEMMs).

A sparse MoE block sends each of ``N`` tokens to ``k`` of ``E`` experts. The reference form loops
over the experts in Python (find the expert's tokens, run its MLP, add the result back): about ten
small kernels and one host synchronisation per expert. :func:`grouped_swiglu` computes the same
thing as follows:

1. the ``N * k`` (token, slot) assignments are sorted by expert (a stable sort of the flattened
   top-k indices), so every expert's tokens form one contiguous segment; ``offsets[e]`` is the end
   of expert ``e``'s segment (:func:`sort_by_expert`; no host synchronisation);
2. the tokens are gathered in that order and the experts run over their segments: on the
   ``grouped_mm`` kernel as two *grouped* GEMMs (``gate_proj`` and ``up_proj`` together, then
   ``down_proj``) with the experts' weights stacked ``[E, out, in]`` (:func:`grouped_linear`), on
   the ``segments`` kernel as each expert's whole SwiGLU on its rows;
3. the outputs go back to their (token, slot) places, ``[N, k, D]``; the caller applies its
   routing weights and sums over the slots (in the order and precision its published model does).

Every step is deterministic (on a GPU the gather's backward sums the ``k`` copies of a token
instead of scattering them with atomic adds). Experts that received no token get an exactly zero
weight gradient, where the loop leaves their ``.grad`` untouched (``None`` after ``zero_grad``);
an optimizer with weight decay or momentum therefore still updates them, as in other
grouped-GEMM MoE trainers.

The expert modules, their parameter names and the module tree are those of the checkpoint
(``experts.{e}.{gate,up,down}_proj.weight``, each an ``nn.Linear`` without bias); nothing is
renamed or re-shaped, so published checkpoints load and save as before.

**Stacked weights** (``grouped_mm``). When the experts' weights of a projection (or of gate and
up together) lie at equal strides in one storage (after :func:`pack_experts`, or inside a flat
buffer an engine laid out in module order), the stack is a strided *view* of them; otherwise it
is a copy made for the GEMM and dropped after it (never kept for the backward pass, which
rebuilds it). The ``segments`` kernel reads each expert's weights directly.
:class:`GroupedExperts` packs a block's experts when it is built and after every ``.to()`` /
``.cuda()`` / ``.half()`` (``nn.Module._apply``), and only weights that own their whole storage:
views into someone else's buffer (FSDP, DeepSpeed), DTensors, meta or empty tensors stay put.

**GEMM kernel** (``kernel=``): ``grouped_mm`` is ``torch._grouped_mm`` (one CUTLASS kernel per
GEMM, no host synchronisation); ``auto`` picks it on CUDA GPUs of compute capability 9.x and 10.x
in bfloat16 with every GEMM dimension a multiple of 8 (16-byte rows, the kernel's alignment) and
fewer than 1024 experts, which is where PyTorch runs that kernel (elsewhere ``torch._grouped_mm``
falls back to a per-group loop that synchronises with the host). Otherwise ``segments``: one host
synchronisation per block for the segment bounds, then each non-empty expert's SwiGLU (forward
and a hand-written backward) on its rows while they are in cache.

Autocast is honoured as ``nn.Linear`` does: under an enabled autocast region the tokens and the
weights are cast to the autocast dtype; gradients come back in each tensor's own dtype.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from dare_core.api import DareError

__all__ = [
    "IMPLS",
    "KERNELS",
    "GroupedExperts",
    "auto_kernel",
    "check_impl",
    "groupable",
    "grouped_linear",
    "grouped_swiglu",
    "pack_experts",
    "sort_by_expert",
]

IMPLS = ("grouped", "loop")
KERNELS = ("auto", "grouped_mm", "segments")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class _SwiGLU(Protocol):
    """A SwiGLU expert ``down_proj(silu(gate_proj(x)) * up_proj(x))`` (the projections the
    module docstring names)."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise DareError(f"experts_impl must be one of {', '.join(IMPLS)}, got {impl!r}")


def groupable(experts: Sequence[nn.Module]) -> bool:
    """True when every expert's projections are plain bias-free ``nn.Linear`` layers (a LoRA or
    other wrapped layer is not: such blocks keep the per-expert loop, which calls the modules)."""
    for m in experts:
        for name in PROJECTIONS:
            lin = getattr(m, name, None)
            if type(lin) is not nn.Linear or lin.bias is not None:
                return False
    return len(experts) > 0


def sort_by_expert(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)`` for ``[N, k]`` expert indices: ``order`` ``[N * k]`` lists the flat
    (token, slot) positions expert by expert (stable: ascending position within an expert),
    ``offsets`` ``[E]`` int32 is the end of each expert's segment in that order."""
    flat = experts.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    bounds = torch.arange(1, num_experts + 1, device=flat.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds, right=False)
    return order, offsets.to(torch.int32)


# --------------------------------------------------------------------------- stacked weights
def _owns_storage(w: torch.Tensor) -> bool:
    """A plain, non-empty tensor alone in its storage (not a view into a buffer someone else
    manages, not in shared CPU memory)."""
    return bool(
        type(w.data) is torch.Tensor
        and not w.is_meta
        and w.numel() > 0
        and w.storage_offset() == 0
        and w.is_contiguous()
        and w.untyped_storage().nbytes() == w.numel() * w.element_size()
        and not (w.device.type == "cpu" and w.is_shared())
    )


def _stride_of(parts: Sequence[Sequence[torch.Tensor]]) -> int:
    """The element stride ``s`` such that expert ``e``'s weights of all ``parts`` are one block
    ``[sum out_j, in]`` starting at ``parts[0][0] + e * s`` in one storage; 0 when they are not."""
    w0 = parts[0][0]
    size, base, n = w0.element_size(), w0.data_ptr(), len(parts[0])
    block = sum(p[0].numel() for p in parts)
    step = block
    if n > 1:
        step, rem = divmod(parts[0][1].data_ptr() - base, size)
        if rem or step < block:
            return 0
    at = base
    for part in parts:
        first = part[0]
        if first.data_ptr() != at or first.dtype != w0.dtype or first.shape[1:] != w0.shape[1:]:
            return 0
        for i, w in enumerate(part):
            if w.data_ptr() != at + i * step * size or w.shape != first.shape or not w.is_contiguous():
                return 0
        at += first.numel() * size
    same = w0.untyped_storage().data_ptr() == parts[-1][-1].untyped_storage().data_ptr()
    return step if same and w0.device == parts[-1][-1].device else 0


def _stacked(parts: Sequence[Sequence[torch.Tensor]], dtype: torch.dtype, aligned: bool = False) -> torch.Tensor:
    """``[E, sum out_j, in]`` in ``dtype``: a view of the weights when :func:`_stride_of` finds
    them laid out so (and the dtype matches; with ``aligned``, when every expert's block starts
    on a 16-byte boundary), else a copy. Not differentiable (used inside :class:`_GroupedLinear`)."""
    w0 = parts[0][0].detach()
    n, rows = len(parts[0]), sum(p[0].shape[0] for p in parts)
    step = _stride_of(parts)
    if aligned and (w0.data_ptr() % 16 or step * w0.element_size() % 16):
        step = 0
    if step:
        view = w0.as_strided((n, rows, w0.shape[1]), (step, w0.shape[1], 1), w0.storage_offset())
        return view if view.dtype == dtype else view.to(dtype)
    stacks = [
        torch.stack([w.detach() for w in p], out=torch.empty((n, *p[0].shape), dtype=dtype, device=w0.device))
        for p in parts
    ]
    return stacks[0] if len(stacks) == 1 else torch.cat(stacks, dim=1)


LAYOUT = (("gate_proj", "up_proj"), ("down_proj",))


@torch.no_grad()
def pack_experts(experts: Sequence[nn.Module]) -> bool:
    """Re-lay the expert weights in two buffers, ``[E, 2F, D]`` (``gate_proj`` rows then
    ``up_proj`` rows of each expert) and ``[E, D, F]`` (``down_proj``), so that the grouped GEMMs
    read them as views. The parameters keep their identity, names and values; only their storage
    moves. Weights that do not own their whole storage, or differ in dtype/device, or are not
    plain tensors are left alone. Returns True when every group is (now) laid out so."""
    if not groupable(experts):
        return False
    packed = True
    for names in LAYOUT:
        parts = [[getattr(m, name).weight for m in experts] for name in names]
        if _stride_of(parts):
            continue
        flat = [p for part in parts for p in part]
        w0 = flat[0]
        if not all(_owns_storage(p) and p.dtype == w0.dtype and p.device == w0.device for p in flat):
            packed = False
            continue
        rows = sum(part[0].shape[0] for part in parts)
        buf = torch.empty((len(experts), rows, w0.shape[1]), dtype=w0.dtype, device=w0.device)
        for e in range(len(experts)):
            at = 0
            for part in parts:
                p = part[e]
                buf[e, at : at + p.shape[0]].copy_(p)
                p.data = buf[e, at : at + p.shape[0]]
                at += p.shape[0]
    return packed


# --------------------------------------------------------------------------- grouped GEMMs
def auto_kernel(x: torch.Tensor, groups: int, out_features: int, in_features: int) -> str:
    """The kernel ``kernel="auto"`` picks for ``x`` (device, dtype) and ``groups`` weights ``[out, in]``."""
    fast = (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and hasattr(torch, "_grouped_mm")
        and groups < 1024
        and out_features % 8 == 0
        and in_features % 8 == 0
        and torch.cuda.get_device_capability(x.device)[0] in (9, 10)
    )
    return "grouped_mm" if fast else "segments"


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` row-major, starting on a 16-byte boundary (what ``torch._grouped_mm`` reads)."""
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def _mm_segments(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, bounds: Optional[list[int]]) -> torch.Tensor:
    """``out[s:e] = a[s:e] @ b[g]`` over the segments of ``offsets`` (host copy ``bounds``; None:
    ``torch._grouped_mm``); ``b`` ``[E, K, N]``."""
    if bounds is None:
        return torch._grouped_mm(_aligned(a), b, offs=offsets)
    out = a.new_empty(a.shape[0], b.shape[-1])
    start = 0
    for g, end in enumerate(bounds):
        if end > start:
            torch.mm(a[start:end], b[g], out=out[start:end])
        start = end
    return out


def _weight_grads(
    gy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, bounds: Optional[list[int]]
) -> torch.Tensor:
    """``[E, out, in]``: ``gy[s:e]ᵀ @ x[s:e]`` per segment, zero for empty segments."""
    if bounds is None:
        gw = torch._grouped_mm(_aligned(gy).t(), _aligned(x), offs=offsets)
        counts = torch.diff(offsets, prepend=offsets.new_zeros(1))
        # empty groups: zero whatever the kernel left there (reported non-zero on some GPUs)
        return torch.where((counts > 0)[:, None, None], gw, torch.zeros((), dtype=gw.dtype, device=gw.device))
    gw = gy.new_empty(offsets.numel(), gy.shape[1], x.shape[1])
    start = 0
    for g, end in enumerate(bounds):
        if end > start:
            torch.mm(gy[start:end].t(), x[start:end], out=gw[g])
        else:
            gw[g].zero_()
        start = end
    return gw


class _GroupedLinear(torch.autograd.Function):
    """``y[s:e] = x[s:e] @ W_gᵀ`` over the expert segments; saves ``x`` and the weights themselves
    (never a stacked copy), differentiable w.r.t. ``x`` and every weight."""

    @staticmethod
    def forward(ctx, x, offsets, bounds, n_parts, *weights):
        n = len(weights) // n_parts
        parts = [weights[j * n : (j + 1) * n] for j in range(n_parts)]
        w = _stacked(parts, x.dtype, aligned=bounds is None)
        with torch.autocast(x.device.type, enabled=False):
            y = _mm_segments(x, w.transpose(1, 2), offsets, bounds)
        ctx.bounds, ctx.n_parts = bounds, n_parts
        ctx.save_for_backward(x, offsets, *weights)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, offsets, *weights = ctx.saved_tensors
        n = len(weights) // ctx.n_parts
        parts = [weights[j * n : (j + 1) * n] for j in range(ctx.n_parts)]
        gy = gy.contiguous()
        gx, gws = None, [None] * len(weights)
        with torch.autocast(x.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                gx = _mm_segments(gy, _stacked(parts, gy.dtype, ctx.bounds is None), offsets, ctx.bounds)
            if any(ctx.needs_input_grad[4:]):
                gw = _weight_grads(gy, x.to(gy.dtype), offsets, ctx.bounds)
                blocks = gw.split([p[0].shape[0] for p in parts], dim=1)
                gws = [
                    blocks[i // n][i % n].to(w.dtype) if ctx.needs_input_grad[4 + i] else None
                    for i, w in enumerate(weights)
                ]
        return (gx, None, None, None, *gws)


def grouped_linear(
    x: torch.Tensor,
    offsets: torch.Tensor,
    *parts: Sequence[torch.Tensor],
    kernel: str = "auto",
    bounds: Optional[list[int]] = None,
) -> torch.Tensor:
    """``[M, sum out_j]`` in ``x``'s dtype: rows ``offsets[g-1]:offsets[g]`` of ``x`` ``[M, in]``
    times the transposed weights of expert ``g``; each part is a list of per-expert
    ``[out_j, in]`` weights (the ``nn.Linear`` layout) and the parts' outputs are concatenated
    (e.g. gate and up projections in one GEMM). ``offsets`` int32 ``[E]``, the last one ``M``;
    ``bounds``: ``offsets.tolist()`` when the caller has it (the ``segments`` kernel needs it on
    the host; one synchronisation per call otherwise)."""
    if kernel not in KERNELS:
        raise DareError(f"grouped GEMM kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == "auto":
        kernel = auto_kernel(x, len(parts[0]), sum(p[0].shape[0] for p in parts), parts[0][0].shape[1])
    if kernel == "segments" and bounds is None:
        bounds = offsets.tolist()
    flat = [w for part in parts for w in part]
    return _GroupedLinear.apply(x, offsets, bounds if kernel == "segments" else None, len(parts), *flat)


class _SegmentSwiGLU(torch.autograd.Function):
    """SwiGLU experts over the sorted segments, one expert at a time (gate, up, silu and down on
    an expert's rows while they are in cache); saves the rows and the gate and up outputs."""

    @staticmethod
    def forward(ctx, xs, bounds, *weights):
        n, dt = len(weights) // 3, xs.dtype
        gate = xs.new_empty(xs.shape[0], weights[0].shape[0])
        up, y = torch.empty_like(gate), xs.new_empty(xs.shape[0], weights[2 * n].shape[0])
        start = 0
        with torch.autocast(xs.device.type, enabled=False):
            for e, end in enumerate(bounds):
                if end > start:
                    rows = xs[start:end]
                    g = torch.mm(rows, weights[e].to(dt).t(), out=gate[start:end])
                    u = torch.mm(rows, weights[n + e].to(dt).t(), out=up[start:end])
                    torch.mm(F.silu(g) * u, weights[2 * n + e].to(dt).t(), out=y[start:end])
                start = end
        ctx.bounds = bounds
        ctx.save_for_backward(xs, gate, up, *weights)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        xs, gate, up, *weights = ctx.saved_tensors
        n, dt, need = len(weights) // 3, xs.dtype, ctx.needs_input_grad
        gy = gy.contiguous()
        gx = torch.empty_like(xs) if need[0] else None  # every row lies in one segment
        grads: list[Optional[torch.Tensor]] = [None] * len(weights)
        start = 0
        with torch.autocast(xs.device.type, enabled=False):
            for e, end in enumerate(ctx.bounds):
                wg, wu, wd = (weights[j * n + e] for j in range(3))
                if end == start:  # no token: zero gradient
                    for j in range(3):
                        grads[j * n + e] = torch.zeros_like(weights[j * n + e]) if need[2 + j * n + e] else None
                    continue
                rows, g, u, d = xs[start:end], gate[start:end], up[start:end], gy[start:end]
                act = F.silu(g)
                dh = d @ wd.to(dt)
                du, dg = dh * act, torch.ops.aten.silu_backward(dh * u, g)
                for j, w, a, b in ((0, wg, dg, rows), (1, wu, du, rows), (2, wd, d, act * u)):
                    if need[2 + j * n + e]:
                        grads[j * n + e] = (a.t() @ b).to(w.dtype)
                if gx is not None:
                    torch.mm(dg, wg.to(dt), out=gx[start:end]).addmm_(du, wu.to(dt))
                start = end
        return (gx, None, *grads)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    if x.dtype != torch.float64 and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def grouped_swiglu(
    x: torch.Tensor, experts: torch.Tensor, modules: Sequence[nn.Module], kernel: str = "auto"
) -> torch.Tensor:
    """Per-slot expert outputs ``[N, k, D]``: ``out[n, j] = modules[experts[n, j]](x[n])`` for
    SwiGLU experts ``down(silu(gate(x)) * up(x))``; ``x`` ``[N, D]``, ``experts`` ``[N, k]``
    (long). Result in the compute dtype (the autocast dtype under autocast, else ``x``'s)."""
    n, k = experts.shape
    dtype = _compute_dtype(x)
    first = cast(_SwiGLU, modules[0])
    out_dim = first.down_proj.weight.shape[0]
    if n == 0:
        return x.new_zeros(0, k, out_dim, dtype=dtype)
    order, offsets = sort_by_expert(experts, len(modules))
    if x.is_cuda:  # k copies, then a permutation: the backward sums the copies (no atomic adds)
        xs = x.to(dtype).repeat_interleave(k, dim=0).index_select(0, order)
    else:  # one gather; its backward adds the k copies in order
        xs = x.to(dtype).index_select(0, order // k)
    inner, e = first.down_proj.in_features, len(modules)
    if kernel == "auto":
        fast = auto_kernel(xs, e, 2 * inner, xs.shape[1]) == auto_kernel(xs, e, out_dim, inner) == "grouped_mm"
        kernel = "grouped_mm" if fast else "segments"

    def weights(name: str) -> list[torch.Tensor]:
        return [getattr(m, name).weight for m in modules]

    if kernel == "grouped_mm":  # gate and up in one GEMM, then down
        gate_up = grouped_linear(xs, offsets, weights("gate_proj"), weights("up_proj"), kernel=kernel)
        gate, up = gate_up.split([first.gate_proj.out_features, first.up_proj.out_features], dim=1)
        y = grouped_linear(F.silu(gate) * up, offsets, weights("down_proj"), kernel=kernel)
    else:
        y = _SegmentSwiGLU.apply(
            xs, offsets.tolist(), *weights("gate_proj"), *weights("up_proj"), *weights("down_proj")
        )
    return torch.empty_like(y).index_copy_(0, order, y).view(n, k, out_dim)


class GroupedExperts(nn.Module):
    """Base of an MoE block whose ``self.experts`` is an ``nn.ModuleList`` of SwiGLU experts.

    ``experts_impl`` (class attribute, settable per instance): ``"grouped"`` (default) computes
    the experts with :func:`grouped_swiglu`; ``"loop"`` runs the block's reference per-expert
    loop. Blocks whose experts are not plain ``nn.Linear`` layers (e.g. LoRA-wrapped) always
    loop. ``experts_kernel``: the ``kernel`` of :func:`grouped_swiglu` (default ``"auto"``). The
    experts are packed (:func:`pack_experts`) by :meth:`pack_experts` and after every ``_apply``
    (``.to()``, ``.cuda()``, ``.half()``, ...); the module tree is unchanged.
    """

    experts_impl: str = "grouped"
    experts_kernel: str = "auto"
    experts: nn.ModuleList  # the subclass's SwiGLU experts

    def grouped(self) -> bool:
        """Whether this forward uses the grouped computation."""
        check_impl(self.experts_impl)
        return self.experts_impl == "grouped" and groupable(list(self.experts))

    def pack_experts(self) -> bool:
        return pack_experts(list(self.experts))

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        pack_experts(list(self.experts))
        return out
