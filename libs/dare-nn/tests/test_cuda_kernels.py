"""The CUDA training kernels against float64 references (skipped without a CUDA device).

The model-level check (packed with every kernel == padded, log-probs and gradients) is the
family contract's ``test_packed_kernels_match_padded``; these check the kernels themselves on
shapes a model would not produce in a unit test (head dim 64, rows not a multiple of 128,
filler slots, one-token documents).
"""

import pytest
import torch

import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core.api import available_kernels
from dare_core.ops.fused_ce import fused_token_logprobs, naive_token_logprobs
from dare_nn.attention import document_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _docs(rows: int, width: int, seed: int) -> torch.Tensor:
    """Random document layouts: lengths 1..width/2, filler (-1) at the end of some rows."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((rows, width), -1, dtype=torch.long)
    doc = 0
    for r in range(rows):
        used = 0
        limit = width - int(torch.randint(0, width // 4, (1,), generator=g)) if r % 2 else width
        while used < limit:
            n = min(limit - used, int(torch.randint(1, width // 2, (1,), generator=g)))
            out[r, used : used + n] = doc
            doc, used = doc + 1, used + n
    return out


def _reference(q, k, v, doc_ids, scale):
    return document_attention(
        q.double().cpu(), k.double().cpu(), v.double().cpu(), doc_ids.cpu(), scale=scale, kernel="sdpa_mask"
    )


def _rel(x, ref):
    return float((x.double().cpu() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [200, 384])
def test_every_kernel_matches_float64_forward_and_backward(dtype, width):
    doc_ids = _docs(3, width, seed=width)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(3, 4, width, 64, generator=g) for _ in range(4))
    scale = 64**-0.5
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = _reference(*leaves, doc_ids, scale)
    ref.backward(dout.double())
    ref_grads = [t.grad for t in leaves]
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    kernels = available_kernels("cuda", dtype)
    assert "flex" in kernels and kernels[-1] == "sdpa_mask"
    for kernel in kernels:
        xs = [t.to("cuda", dtype).requires_grad_(True) for t in (q, k, v)]
        out = document_attention(*xs, doc_ids.cuda(), scale=scale, kernel=kernel)
        assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
        assert _rel(out.detach(), ref.detach()) < tol, (kernel, _rel(out.detach(), ref.detach()))
        out.backward(dout.to("cuda", dtype))
        for name, x, want in zip("qkv", xs, ref_grads):
            assert _rel(x.grad, want) < 2 * tol, (kernel, name, _rel(x.grad, want))


def test_half_precision_kernels_refuse_float32():
    if "varlen" not in available_kernels("cuda", torch.bfloat16):
        pytest.skip("torch has no varlen_attn")
    q = torch.randn(1, 2, 8, 16, device="cuda")
    with pytest.raises(ValueError, match="bf16 or fp16"):
        document_attention(q, q, q, torch.zeros(1, 8, dtype=torch.long, device="cuda"), kernel="varlen")


def test_fused_cross_entropy_on_cuda_equals_naive():
    g = torch.Generator().manual_seed(1)
    n, d, vocab = 1024, 128, 50_000
    hidden = torch.randn(n, d, generator=g).cuda()
    weight = (torch.randn(vocab, d, generator=g) / d**0.5).cuda()
    targets = torch.randint(0, vocab, (n,), generator=g).cuda()
    results = []
    for fn in (naive_token_logprobs, lambda h, w, t: fused_token_logprobs(h, w, t, chunk=128)):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        lp = fn(h, w, targets)
        (-lp.sum()).backward()
        results.append((lp.detach(), h.grad, w.grad))
    for a, b in zip(*results):
        assert float((a - b).norm() / b.norm()) < 1e-5


@pytest.mark.parametrize("backend", ["low_confidence", "fast"])
def test_sampling_rollouts_on_cuda_with_the_runs_cpu_generator(backend):
    """Temperature > 0 and random remasking draw on the GPU from the run's CPU generator,
    reproducibly for one seed."""
    from dare_core.config.structure import structure
    from dare_core.plugins import build
    from dare_core.testing.toy import make_toy_wrapper
    from dare_core.workflows.batching import left_pad

    dare = build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks])
    w = make_toy_wrapper()
    w.module.cuda()
    spec = dare.registries.rollouts.get(backend)
    fields = dict(gen_length=16, block_length=8, steps=8, temperature=1.0, remasking="random")
    if backend == "fast":
        fields["decoding"] = "quota"  # threshold decoding needs model confidences
    cfg, problems = structure(spec.config_cls, fields)
    assert not problems, problems
    ids, mask = left_pad([w.encode("12+3="), w.encode("7")], w.pad_token_id)
    runs = [
        spec.build(cfg).generate(w, ids.cuda(), mask.cuda(), generator=torch.Generator().manual_seed(0))
        for _ in range(2)
    ]
    assert runs[0].response_ids.is_cuda and torch.equal(runs[0].response_ids, runs[1].response_ids)
