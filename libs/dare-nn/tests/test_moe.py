"""dare_nn.moe: grouped SwiGLU experts equal the per-expert loop (outputs and gradients), the
packed weight layout, and the stacked weights never kept for the backward pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dare_core.api import DareError
from dare_nn import moe
from dare_nn.layers import SwiGLU

REL = 1e-6


def _cpu_grouped_mm() -> bool:
    try:
        torch._grouped_mm(torch.ones(4, 4), torch.ones(1, 4, 4), offs=torch.tensor([4], dtype=torch.int32))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


KERNELS = [
    "segments",
    pytest.param(
        "grouped_mm", marks=pytest.mark.skipif(not _cpu_grouped_mm(), reason="this torch has no CPU torch._grouped_mm")
    ),
]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def experts_of(n, d, f, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(SwiGLU(d, f) for _ in range(n))


def loop_reference(x, idx, experts):
    """The per-expert loop: out[n, j] = experts[idx[n, j]](x[n])."""
    out = None
    for e in torch.unique(idx).tolist():
        rows, slots = torch.where(idx == e)
        y = experts[e](x[rows])
        out = y.new_zeros(*idx.shape, y.shape[-1]) if out is None else out
        out[rows, slots] = y
    return out


def outputs_and_grads(fn, x, idx, experts, probe):
    for p in experts.parameters():
        p.grad = None
    h = x.detach().requires_grad_(True)
    y = fn(h, idx, experts)
    (y * probe).sum().backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in experts.parameters()]
    return y.detach(), h.grad, torch.cat([g.reshape(-1) for g in grads])


def random_assignment(n, k, e, g):
    """[n, k] distinct experts per token (as top-k gives)."""
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]) if n else torch.zeros(0, k).long()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_experts,k,n_tokens", [(1, 1, 7), (4, 1, 1), (8, 2, 13), (16, 8, 9), (64, 8, 3), (6, 2, 40)])
def test_grouped_equals_loop(kernel, n_experts, k, n_tokens):
    d, f = 32, 24  # 16-byte rows in fp32, as torch._grouped_mm wants
    experts = experts_of(n_experts, d, f)
    g = torch.Generator().manual_seed(n_experts * 100 + k)
    x = torch.randn(n_tokens, d, generator=g)
    idx = random_assignment(n_tokens, k, n_experts, g)
    probe = torch.randn(n_tokens, k, d, generator=g)
    want = outputs_and_grads(loop_reference, x, idx, experts, probe)
    got = outputs_and_grads(lambda h, i, m: moe.grouped_swiglu(h, i, m, kernel), x, idx, experts, probe)
    for a, b in zip(got, want):
        assert rel(a, b) <= REL
    used = set(idx.reshape(-1).tolist())
    if len(used) < n_experts:  # experts that got no token: exactly zero gradient
        unused = next(e for e in range(n_experts) if e not in used)
        assert all(torch.count_nonzero(p.grad) == 0 for p in experts[unused].parameters())


def test_odd_sizes_and_all_tokens_on_one_expert():
    experts = experts_of(5, 10, 6)
    x = torch.randn(11, 10)
    probe = torch.randn(11, 2, 10)
    for idx in (torch.tensor([[3, 1]] * 11), torch.tensor([[4, 0]] * 11)):
        want = outputs_and_grads(loop_reference, x, idx, experts, probe)
        got = outputs_and_grads(moe.grouped_swiglu, x, idx, experts, probe)
        assert all(rel(a, b) <= REL for a, b in zip(got, want))


def test_no_tokens():
    experts = experts_of(3, 8, 4)
    y = moe.grouped_swiglu(torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.long), experts)
    assert y.shape == (0, 2, 8)


def test_sort_by_expert_segments():
    idx = torch.tensor([[3, 0], [3, 5], [0, 3], [5, 3]])
    order, offsets = moe.sort_by_expert(idx, 7)
    flat = idx.reshape(-1)
    assert flat[order].tolist() == sorted(flat.tolist())
    assert order.tolist() == [1, 4, 0, 2, 5, 7, 3, 6]  # stable within an expert
    assert offsets.dtype == torch.int32 and offsets.tolist() == [2, 2, 2, 6, 6, 8, 8]


def test_grouped_linear_with_parts_and_weight_gradients():
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(6, 8, generator=g, requires_grad=True) for _ in range(3)]
    b = [torch.randn(2, 8, generator=g, requires_grad=True) for _ in range(3)]
    x = torch.randn(10, 8, generator=g, requires_grad=True)
    offsets = torch.tensor([4, 4, 10], dtype=torch.int32)
    y = moe.grouped_linear(x, offsets, a, b, kernel="segments")
    segs = [(0, 4), (4, 4), (4, 10)]
    want = torch.cat([x[s:e] @ torch.cat([a[i], b[i]]).T for i, (s, e) in enumerate(segs)])
    assert rel(y, want) <= REL
    probe = torch.randn(10, 8, generator=g)
    gx, *gw = torch.autograd.grad((y * probe).sum(), [x, *a, *b])
    rx, *rw = torch.autograd.grad((want * probe).sum(), [x, *a, *b], allow_unused=True)
    assert rel(gx, rx) <= REL
    for got, ref in zip(gw, rw):
        if ref is None:  # expert 1 had no rows
            assert torch.count_nonzero(got) == 0
        else:
            assert rel(got, ref) <= REL
    with pytest.raises(DareError, match="kernel must be one of"):
        moe.grouped_linear(x, offsets, a, kernel="cutlass")


def _layouts(experts):
    return [moe._stride_of([[getattr(m, n).weight for m in experts] for n in names]) for names in moe.LAYOUT]


def test_pack_keeps_parameters_and_makes_views():
    experts = experts_of(4, 16, 8)
    before = {n: (p, p.detach().clone()) for n, p in experts.named_parameters()}
    assert _layouts(experts) == [0, 0]
    assert moe.pack_experts(experts)
    assert _layouts(experts) == [2 * 8 * 16, 16 * 8]
    for n, p in experts.named_parameters():  # same objects, names and values
        assert p is before[n][0] and torch.equal(p, before[n][1])
    stacked = moe._stacked([[m.gate_proj.weight for m in experts], [m.up_proj.weight for m in experts]], torch.float32)
    assert stacked.data_ptr() == experts[0].gate_proj.weight.data_ptr()  # a view, no copy
    assert torch.equal(stacked[2, 8:], experts[2].up_proj.weight)


def test_grouped_experts_repacks_after_to_and_leaves_foreign_buffers_alone():
    class Block(moe.GroupedExperts):
        def __init__(self):
            super().__init__()
            self.experts = experts_of(3, 8, 4)
            self.pack_experts()

    block = Block()
    assert _layouts(block.experts) == [64, 32]
    for p in block.parameters():  # separate tensors, as a per-parameter dtype cast leaves them
        p.data = p.data.clone()
    assert _layouts(block.experts) == [0, 0]
    block.to(torch.float64)
    assert _layouts(block.experts) == [64, 32] and block.experts[1].down_proj.weight.dtype == torch.float64
    # an engine's flat buffer in module order (gate, up, down of expert 0, then expert 1, ...):
    # read as strided views, never moved
    flat = torch.randn(sum(p.numel() for p in block.parameters()), dtype=torch.float64)
    at = 0
    for p in block.parameters():
        p.data = flat[at : at + p.numel()].view_as(p)
        at += p.numel()
    ptrs = [p.data_ptr() for p in block.parameters()]
    block.to(torch.float64)
    assert [p.data_ptr() for p in block.parameters()] == ptrs
    assert _layouts(block.experts) == [3 * 32, 3 * 32]
    # shared CPU memory (multiprocess training) stays shared
    for p in block.parameters():
        p.data = p.data.clone()
    block.share_memory()
    assert all(p.is_shared() for p in block.parameters()) and _layouts(block.experts) == [0, 0]


@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_keeps_no_stacked_copy(kernel):
    experts = experts_of(6, 16, 8)
    for p in experts.parameters():
        p.data = p.data.clone()  # not packed: the stack is a copy
    assert _layouts(experts) == [0, 0]
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    x = torch.randn(10, 16, requires_grad=True)
    idx = random_assignment(10, 2, 6, torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = moe.grouped_swiglu(x, idx, experts, kernel)
    assert shapes and not [s for s in shapes if len(s) == 3 and s[0] == 6]
    y.sum().backward()
    assert all(p.grad is not None for p in experts.parameters())


def test_autocast_computes_in_the_autocast_dtype():
    experts = experts_of(4, 16, 8)
    x = torch.randn(6, 16)
    idx = random_assignment(6, 2, 4, torch.Generator().manual_seed(1))
    probe = torch.randn(6, 2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = outputs_and_grads(loop_reference, x, idx, experts, probe)
        got = outputs_and_grads(moe.grouped_swiglu, x, idx, experts, probe)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32
    assert experts[0].gate_proj.weight.grad.dtype == torch.float32
    for a, b in zip(got, want):
        assert rel(a, b) <= 2e-2


def test_wrapped_projections_are_not_groupable_and_bad_impl_is_an_error():
    experts = experts_of(2, 8, 4)
    assert moe.groupable(experts)

    class Wrapped(nn.Linear):
        pass

    experts[1].up_proj = Wrapped(8, 4, bias=False)
    assert not moe.groupable(experts) and not moe.pack_experts(experts)
    moe.check_impl("loop")
    with pytest.raises(DareError, match="experts_impl must be one of grouped, loop"):
        moe.check_impl("fast")


@pytest.mark.parametrize("packed", [True, False])
def test_bf16_grouped_mm_matches_segments(packed):
    """The grouped_mm layouts in bfloat16 (strided views of packed weights, or stacked copies)."""
    if not _cpu_grouped_mm():
        pytest.skip("this torch has no CPU torch._grouped_mm")
    experts = experts_of(8, 32, 16).to(torch.bfloat16)
    if packed:
        moe.pack_experts(experts)
    assert (_layouts(experts) != [0, 0]) == packed
    x = torch.randn(12, 32).to(torch.bfloat16)
    idx = random_assignment(12, 2, 8, torch.Generator().manual_seed(2))
    probe = torch.randn(12, 2, 32).to(torch.bfloat16)
    want = outputs_and_grads(lambda h, i, m: moe.grouped_swiglu(h, i, m, "segments"), x, idx, experts, probe)
    got = outputs_and_grads(lambda h, i, m: moe.grouped_swiglu(h, i, m, "grouped_mm"), x, idx, experts, probe)
    assert all(a.dtype == torch.bfloat16 for a in got)
    for a, b in zip(got, want):
        assert rel(a, b) <= 2e-2
