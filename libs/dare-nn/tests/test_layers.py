"""The shared model building blocks (dare_nn.layers) against hand computations.

Every oracle here is written out independently of the implementation: explicit loops, closed
forms (rotation of a known vector), or indexing by hand.
"""

import math

import pytest
import torch
from torch import nn

from dare_core.errors import DareError
from dare_nn import layers
from dare_nn.layers import (
    AttentionMaskError,
    KVCacheError,
    ModelInputError,
    RMSNorm,
    SwiGLU,
)


# ------------------------------------------------------------------------------------------ RMSNorm
def test_rmsnorm_matches_the_formula_row_by_row():
    torch.manual_seed(0)
    norm = RMSNorm(5, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0]))
    x = torch.randn(3, 5)
    with torch.no_grad():
        got = norm(x)
    for r in range(3):
        ms = sum(float(v) ** 2 for v in x[r]) / 5
        for c in range(5):
            want = float(norm.weight[c].detach()) * float(x[r, c]) / math.sqrt(ms + 1e-5)
            assert abs(float(got[r, c]) - want) < 1e-5
    assert norm.variance_epsilon == norm.eps == 1e-5
    assert list(dict(norm.named_parameters())) == ["weight"]


def test_rmsnorm_weight_before_or_after_the_cast_in_bf16():
    torch.manual_seed(1)
    x = torch.randn(64, 32).to(torch.bfloat16)
    w = (1.0 + torch.randn(32)).to(torch.bfloat16)
    xf = x.float()
    normed = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    after_cast = w * normed.to(torch.bfloat16)  # HF-Llama order
    in_fp32 = (normed * w.float()).to(torch.bfloat16)  # fused-kernel order
    assert not torch.equal(after_cast, in_fp32)  # the option is observable
    for fp32, want in ((False, after_cast), (True, in_fp32)):
        norm = RMSNorm(32, 1e-6, weight_in_fp32=fp32).to(torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(w)
        got = norm(x)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-2)
        assert (got == want).float().mean() > 0.99


# ------------------------------------------------------------------------------------------ RoPE
def test_rotary_cos_sin_values():
    pos = torch.tensor([[0, 1, 3]])
    cos, sin = layers.rotary_cos_sin(pos, 4, 100.0)
    assert cos.shape == sin.shape == (1, 1, 3, 4) and cos.dtype == torch.float32
    inv = [1.0, 100.0**-0.5]  # theta ** (-2j / dim) for j = 0, 1
    for i, p in enumerate([0, 1, 3]):
        for j in range(4):
            a = p * inv[j % 2]
            assert abs(float(cos[0, 0, i, j]) - math.cos(a)) < 1e-6
            assert abs(float(sin[0, 0, i, j]) - math.sin(a)) < 1e-6
    c16, s16 = layers.rotary_cos_sin(pos, 4, 100.0, torch.bfloat16)
    assert c16.dtype == torch.bfloat16 and torch.equal(c16, cos.to(torch.bfloat16))


def test_rotation_of_a_known_vector_and_relative_positions():
    # head_dim 2: the pair (x1, x2) turns by angle p (inv_freq = 1): (x1 cos - x2 sin, x2 cos + x1 sin)
    pos = torch.tensor([[2]])
    cos, sin = layers.rotary_cos_sin(pos, 2, 10000.0)
    x = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2)
    got = layers.apply_rotary(x, cos, sin).flatten()
    torch.testing.assert_close(got, torch.tensor([math.cos(2.0), math.sin(2.0)]))
    y = torch.tensor([0.3, -0.7]).view(1, 1, 1, 2)
    got = layers.apply_rotary(y, cos, sin).flatten()
    want = torch.tensor([0.3 * math.cos(2) + 0.7 * math.sin(2), -0.7 * math.cos(2) + 0.3 * math.sin(2)])
    torch.testing.assert_close(got, want)
    # the score of a rotated query and key depends on the position difference only
    torch.manual_seed(2)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(pq, pk):
        cq, sq = layers.rotary_cos_sin(torch.tensor([[pq]]), 8, 10000.0)
        ck, sk = layers.rotary_cos_sin(torch.tensor([[pk]]), 8, 10000.0)
        return float((layers.apply_rotary(q, cq, sq) * layers.apply_rotary(k, ck, sk)).sum())

    assert abs(score(5, 2) - score(13, 10)) < 1e-4
    assert abs(score(5, 2) - score(5, 3)) > 1e-3


def test_rotate_half_and_upcast():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert layers.rotate_half(x).tolist() == [-3.0, -4.0, 1.0, 2.0]
    torch.manual_seed(3)
    xb = torch.randn(2, 3, 5, 8).to(torch.bfloat16)
    cos, sin = layers.rotary_cos_sin(torch.arange(5)[None].expand(2, 5) * 7, 8, 10000.0)
    up = layers.apply_rotary(xb, cos, sin, upcast=True)
    assert up.dtype == torch.bfloat16
    xf = xb.float()
    assert torch.equal(up, (xf * cos + layers.rotate_half(xf) * sin).to(torch.bfloat16))


# ------------------------------------------------------------------------------------------ attention
def test_repeat_kv_indexing():
    kv = torch.arange(3.0).view(1, 3, 1, 1).expand(2, 3, 4, 5)  # kv head i holds the value i
    rep = layers.repeat_kv(kv, 2)
    assert rep.shape == (2, 6, 4, 5)
    for h in range(6):
        assert bool((rep[:, h] == h // 2).all())
    assert layers.repeat_kv(kv, 1) is kv


def _hand_attention(q, k, v, allowed, scale):
    """Explicit loops: softmax over allowed keys; zeros when none is allowed."""
    B, H, Q, hd = q.shape
    K = k.shape[2]
    out = torch.zeros(B, H, Q, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Q):
                keys = [j for j in range(K) if allowed[b, i, j]]
                if not keys:
                    continue
                s = [scale * sum(float(q[b, h, i, d]) * float(k[b, h, j, d]) for d in range(hd)) for j in keys]
                m = max(s)
                e = [math.exp(x - m) for x in s]
                z = sum(e)
                for w, j in zip(e, keys):
                    out[b, h, i] += (w / z) * v[b, h, j].double()
    return out


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_attention_with_bool_and_additive_masks_and_dead_rows(kernel):
    torch.manual_seed(4)
    B, H, Q, K, hd = 2, 2, 3, 4, 4
    q, k, v = torch.randn(B, H, Q, hd), torch.randn(B, H, K, hd), torch.randn(B, H, K, hd)
    allowed = torch.rand(B, Q, K) > 0.4
    allowed[0, 1] = False  # a query that may attend to nothing
    allowed[1, 2] = True
    scale = 0.5
    want = _hand_attention(q, k, v, allowed, scale).float()
    fn = layers.attention(kernel)
    got_bool = fn(q, k, v, allowed[:, None], scale)
    additive = torch.zeros(B, 1, Q, K).masked_fill(~allowed[:, None], float("-inf"))
    got_add = fn(q, k, v, additive, scale)
    for got in (got_bool, got_add):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert bool((got[0, :, 1] == 0).all())
    everything = fn(q, k, v, None, scale)
    torch.testing.assert_close(
        everything, _hand_attention(q, k, v, torch.ones(B, Q, K, dtype=torch.bool), scale).float(), atol=1e-5, rtol=1e-5
    )


def test_eager_fp32_scores_in_bf16():
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 4, 8).to(torch.bfloat16) for _ in range(3))
    scale = 8**-0.5
    scores32 = (q @ k.transpose(-1, -2)).float() * scale
    want32 = torch.softmax(scores32, -1).to(torch.bfloat16) @ v
    scores16 = (q @ k.transpose(-1, -2)) * scale
    want16 = torch.softmax(scores16.float(), -1).to(torch.bfloat16) @ v
    assert torch.equal(layers.eager_attention(q, k, v, None, scale, fp32_scores=True), want32)
    assert torch.equal(layers.eager_attention(q, k, v, None, scale), want16)


def test_attend_concatenates_the_cache_first_and_repeats_kv_heads():
    torch.manual_seed(6)
    B, H, KV, P, Q, hd = 2, 4, 2, 3, 2, 4
    q = torch.randn(B, H, Q, hd)
    k_new, v_new = torch.randn(B, KV, Q, hd), torch.randn(B, KV, Q, hd)
    past = (torch.randn(B, KV, P, hd).double(), torch.randn(B, KV, P, hd).double())  # cast to the new dtype
    out, (k, v) = layers.attend(q, k_new, v_new, None, scale=0.5, implementation="eager", past=past)
    assert k.shape == v.shape == (B, KV, P + Q, hd) and k.dtype == torch.float32
    assert torch.equal(k[:, :, :P], past[0].float()) and torch.equal(k[:, :, P:], k_new)
    assert torch.equal(v[:, :, :P], past[1].float()) and torch.equal(v[:, :, P:], v_new)
    # by hand: query head h reads kv head h // 2 over all P + Q keys, heads merged as [B, Q, H * hd]
    assert out.shape == (B, Q, H * hd)
    for h in range(H):
        kh, vh = k[:, h // 2], v[:, h // 2]
        probs = torch.softmax(0.5 * q[:, h] @ kh.transpose(-1, -2), -1)
        torch.testing.assert_close(out[:, :, h * hd : (h + 1) * hd], probs @ vh, atol=1e-6, rtol=1e-5)
    out2, kv2 = layers.attend(q, k_new, v_new, None, scale=0.5, implementation=None, past=None)
    assert kv2[0] is k_new and out2.shape == (B, Q, H * hd)
    with pytest.raises(ModelInputError, match="flash"):
        layers.attention("flash")


def test_split_and_merge_heads():
    x = torch.arange(2 * 3 * 6.0).view(2, 3, 6)
    s = layers.split_heads(x, 2, 3)
    assert s.shape == (2, 2, 3, 3)
    assert s[1, 1, 2].tolist() == x[1, 2, 3:6].tolist()
    assert torch.equal(layers.merge_heads(s), x)


def test_pre_norm_residual_and_swiglu():
    x = torch.tensor([[[1.0, -2.0]]])
    out, present = layers.pre_norm_residual(
        x, lambda t: 2 * t, lambda t, c: (t + c, "kv"), lambda t: t - 1, lambda t: 10 * t, 3.0
    )
    h = x + (2 * x + 3.0)
    assert present == "kv" and torch.equal(out, h + 10 * (h - 1))
    out2, none = layers.pre_norm_residual(
        x, lambda t: 2 * t, lambda t, c: (t + c, "kv"), lambda t: t - 1, lambda t: 10 * t, 3.0, keep_present=False
    )
    assert none is None and torch.equal(out2, out)  # a layer that is not caching returns no views
    torch.manual_seed(7)
    mlp = SwiGLU(4, 6)
    assert sorted(k for k, _ in mlp.state_dict().items()) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]
    z = torch.randn(3, 4)
    g, u = z @ mlp.gate_proj.weight.T, z @ mlp.up_proj.weight.T
    want = ((g / (1 + torch.exp(-g))) * u) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(z), want)


# ------------------------------------------------------------------------------------------ masks
def test_prepare_attention_mask_forms():
    ones = torch.ones(2, 5)
    assert layers.prepare_attention_mask(None, 2, 3, 5, 4) is None
    assert layers.prepare_attention_mask("full", 2, 3, 5, 4) is None
    assert layers.prepare_attention_mask(ones, 2, 3, 5, 4) is None
    pad = ones.clone()
    pad[1, 0] = 0
    m = layers.prepare_attention_mask(pad, 2, 3, 5, 4)
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 5)
    assert m[1, 0, 0].tolist() == [False, True, True, True, True] and bool(m[0].all())
    four = torch.zeros(1, 1, 3, 5)
    assert layers.prepare_attention_mask(four, 2, 3, 5, 4) is four
    bad = [
        torch.ones(2, 4),
        torch.full((2, 5), 2.0),
        torch.ones(2, 1, 3, 4, dtype=torch.bool),
        torch.ones(2, 1, 3, 5, dtype=torch.long),
        torch.ones(3, 1, 3, 5),
        torch.ones(2, 3, 5),
        "causal",
    ]
    for b in bad:
        with pytest.raises(AttentionMaskError) as err:
            layers.prepare_attention_mask(b, 2, 3, 5, 4)
        assert isinstance(err.value, ValueError) and isinstance(err.value, DareError)


def test_key_padding_and_4d_checks():
    keep = layers.key_padding_mask(torch.tensor([[1, 0, 1]]), 1, 3)
    assert keep.tolist() == [[True, False, True]]
    with pytest.raises(AttentionMaskError, match="key-padding mask"):
        layers.key_padding_mask(torch.ones(1, 2), 1, 3)

    class Mine(AttentionMaskError):
        pass

    with pytest.raises(Mine):
        layers.key_padding_mask(torch.tensor([[0.5, 1.0, 1.0]]), 1, 3, error=Mine)
    m = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    assert layers.check_4d_mask(m, 2, 4, 3, 6) is m  # one query row broadcasts
    with pytest.raises(AttentionMaskError, match="does not match"):
        layers.check_4d_mask(m, 2, 4, 3, 6, exact_queries=True)
    with pytest.raises(AttentionMaskError):
        layers.check_4d_mask(torch.ones(2, 2, 3, 6, dtype=torch.bool), 2, 1, 3, 6)


# ------------------------------------------------------------------------------------------ inputs / cache
def test_check_kv_cache():
    k = torch.zeros(2, 3, 4, 5)
    assert layers.check_kv_cache(None, n_layers=2, batch=2, kv_heads=3, head_dim=5) == (None, 0)
    assert layers.check_kv_cache([], n_layers=2, batch=2, kv_heads=3, head_dim=5) == (None, 0)
    past, P = layers.check_kv_cache([(k, k), (k, k)], n_layers=2, batch=2, kv_heads=3, head_dim=5)
    assert P == 4 and len(past) == 2
    cases = [
        (object(), "one \\(key, value\\) pair per layer"),
        ([(k, k)], "one per layer"),
        ([(k, k), (k,)], "pair"),
        ([(k, k), (k[:, :2], k[:, :2])], "n_kv_heads"),
        ([(k, k), (k[:, :, :3], k[:, :, :3])], "one P"),
        ([(k, k), (k, k[..., :4])], "head_dim"),
    ]
    for value, pattern in cases:
        with pytest.raises(KVCacheError, match=pattern):
            layers.check_kv_cache(value, n_layers=2, batch=2, kv_heads=3, head_dim=5)


def test_positions_and_inputs():
    d = torch.device("cpu")
    assert layers.position_ids_or_default(None, 2, 3, d, start=4).tolist() == [[4, 5, 6]] * 2
    assert layers.position_ids_or_default(torch.tensor([7, 8, 9]), 2, 3, d).tolist() == [[7, 8, 9]] * 2
    with pytest.raises(ModelInputError, match="position_ids"):
        layers.position_ids_or_default(torch.arange(4), 2, 3, d)
    emb = nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(layers.embed_inputs(emb, ids, None), emb(ids))
    for a, b in ((None, None), (ids, emb(ids)), (None, torch.zeros(3, 4))):
        with pytest.raises(ModelInputError):
            layers.embed_inputs(emb, a, b)
    k = torch.zeros(1, 1, 2, 4)
    x, past, P, pos = layers.decoder_inputs(emb, ids, None, None, [(k, k)], n_layers=1, kv_heads=1, head_dim=4)
    assert P == 2 and pos.tolist() == [[2, 3, 4]] and x.shape == (1, 3, 4)
    _, _, _, pos0 = layers.decoder_inputs(
        emb, ids, None, None, [(k, k)], n_layers=1, kv_heads=1, head_dim=4, positions_after_cache=False
    )
    assert pos0.tolist() == [[0, 1, 2]]


def test_run_layers_order_of_hidden_states_and_cache():
    class Add(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c

        def forward(self, x, scale, past, *, use_cache):
            return x * scale + self.c, (self.c, past) if use_cache else None

    x = torch.ones(1, 1, 1)
    out, hidden, presents = layers.run_layers(
        [Add(1.0), Add(2.0)],
        x,
        3.0,
        past=["p0", "p1"],
        final_norm=lambda t: -t,
        output_hidden_states=True,
        use_cache=True,
    )
    # every layer's input, then the final-norm output (n_layers + 1 entries)
    assert [float(h) for h in hidden] == [1.0, 4.0, -14.0] and float(out) == -14.0
    assert presents == [(1.0, "p0"), (2.0, "p1")]
    out, hidden, presents = layers.run_layers([Add(1.0)], x, 1.0)
    assert hidden is None and presents is None and float(out) == 2.0


def test_reject_options():
    layers.reject_options("M", {"labels": None, "dual_cache": False}, ("labels", "dual_cache"))
    with pytest.raises(ModelInputError, match="M.forward does not support 'labels'"):
        layers.reject_options("M", {"labels": 1}, ("labels",))


# ------------------------------------------------------------------------------------------ PreTrainedModel helpers
@torch.no_grad()
def test_init_weights_and_embedding_accessors():
    torch.manual_seed(8)
    lin, emb, norm = nn.Linear(200, 300), nn.Embedding(500, 64, padding_idx=3), RMSNorm(7)
    with torch.no_grad():
        norm.weight.fill_(5.0)
    for m in (lin, emb, norm):
        layers.init_weights(m, 0.02)
    assert abs(float(lin.weight.std()) - 0.02) < 1e-3 and bool((lin.bias == 0).all())
    assert bool((emb.weight[3] == 0).all()) and abs(float(emb.weight.std()) - 0.02) < 1e-3
    assert bool((norm.weight == 1).all())
    cut = nn.Linear(300, 300)
    layers.init_weights(cut, 0.02, cutoff=1.5)
    assert float(cut.weight.abs().max()) <= 0.03 + 1e-7

    class Toy(layers.EmbeddingAccessors, nn.Module):
        input_embeddings_path = "model.inner.wte"
        output_embeddings_path = "head"

        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.inner = nn.ModuleDict({"wte": nn.Embedding(4, 2)})
            self.head = nn.Linear(2, 4)

    toy = Toy()
    assert toy.get_input_embeddings() is toy.model.inner["wte"] and toy.get_output_embeddings() is toy.head
    new_e, new_h = nn.Embedding(6, 2), nn.Linear(2, 6)
    toy.set_input_embeddings(new_e)
    toy.set_output_embeddings(new_h)
    assert toy.model.inner["wte"] is new_e and toy.head is new_h
    assert "model.inner.wte.weight" in toy.state_dict()


# ------------------------------------------------------------------------------------------ config checks
def test_config_checks():
    class Cfg:
        a, b, flag, drop, _attn_implementation = 3, 0, True, 0.1, "flex"

    class MyError(ValueError):
        pass

    bad = layers.config_error("MyConfig", MyError)
    with pytest.raises(MyError, match="^MyConfig: b must be a positive int, got 0$"):
        layers.check_positive_ints(Cfg, ("a", "b"), bad)
    with pytest.raises(MyError, match="flag must be a positive int"):
        layers.check_positive_ints(Cfg, ("flag",), bad)
    layers.check_heads(8, 2, bad, rotary_dim=16)
    with pytest.raises(MyError, match="divisor"):
        layers.check_heads(8, 3, bad)
    with pytest.raises(MyError, match="even"):
        layers.check_heads(8, 2, bad, rotary_dim=15)
    with pytest.raises(MyError, match="drop=0.1"):
        layers.check_no_dropout(Cfg, ("drop",), bad)
    with pytest.raises(MyError, match="rope_theta"):
        layers.check_rope_theta(-1.0, bad)
    with pytest.raises(MyError, match="'flex'"):
        layers.check_attn_implementation(Cfg, ("eager", "sdpa"), bad)
    assert layers.attn_implementation_kwargs({"_attn_implementation": "eager"}) == {"attn_implementation": "eager"}
    assert layers.attn_implementation_kwargs({"attn_implementation": "fa2"}, {"fa2": "sdpa"}) == {
        "attn_implementation": "sdpa"
    }
