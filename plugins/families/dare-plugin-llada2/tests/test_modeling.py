"""LLaDA2-MoE facts (arXiv:2512.15745) checked on 1-2 layer models against hand computations.

The reference forward below is written from the description in the plugin README (per-token loops,
explicit index arithmetic), independently of ``modeling_llada2_moe``.
"""

import json
import math
import os

import pytest
import torch
from safetensors import safe_open

from dare_nn import layers
from dare_nn.block import block_causal_mask, block_index
from dare_plugin_llada2.configuration_llada2_moe import LLaDA2ConfigError, LLaDA2MoeConfig
from dare_plugin_llada2.hf import register_auto_classes
from dare_plugin_llada2.modeling_llada2_moe import (
    LLaDA2MaskError,
    LLaDA2MoeGate,
    LLaDA2MoeMLP,
    LLaDA2MoeModelLM,
    LLaDA2MoeSparseMoeBlock,
    apply_partial_rotary,
    rotary_cos_sin,
)

register_auto_classes()  # AutoConfig / AutoModel* resolve the native classes

H, KV, HD = 4, 2, 8  # heads, kv heads, head_dim


def tiny_config(**kw):
    base = dict(
        vocab_size=48,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=HD,
        num_experts=8,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        moe_intermediate_size=12,
        num_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        pad_token_id=0,
        eos_token_id=0,
        mask_token_id=1,
        max_position_embeddings=64,
    )
    base.update(kw)
    return LLaDA2MoeConfig(**base)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = LLaDA2MoeModelLM(tiny_config()).eval()
    with torch.no_grad():  # non-trivial norm weights and expert biases so their placement matters
        for name, p in m.named_parameters():
            if "layernorm" in name or name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        for layer in m.model.layers[1:]:
            layer.mlp.gate.expert_bias.copy_(torch.randn(8) * 0.3)
    return m


# ----------------------------------------------------------------------------- reference pieces
def ref_rmsnorm(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def ref_rope_vec(v, pos, theta, rdim):
    """Rotate dims j and j + rdim/2 (j < rdim/2) by pos * theta^(-2j/rdim); dims >= rdim untouched."""
    out = v.clone()
    half = rdim // 2
    for j in range(half):
        ang = pos * theta ** (-2.0 * j / rdim)
        a, b = v[j], v[j + half]
        out[j] = a * math.cos(ang) - b * math.sin(ang)
        out[j + half] = b * math.cos(ang) + a * math.sin(ang)
    return out


def ref_mlp(x, mlp):
    g = x @ mlp.gate_proj.weight.T
    return (g * torch.sigmoid(g) * (x @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T


def ref_route(x, gate, n_group, topk_group, top_k, scale):
    """One token: experts and weights by the group-limited sigmoid rule (plugin README)."""
    s = torch.sigmoid(gate.weight.double() @ x.double())
    sel = s + gate.expert_bias.double()
    per = len(s) // n_group
    group_scores = []
    for g in range(n_group):
        vals = sorted(sel[g * per : (g + 1) * per].tolist(), reverse=True)
        group_scores.append(vals[0] + vals[1])
    groups = sorted(range(n_group), key=lambda g: -group_scores[g])[:topk_group]
    allowed = [e for g in groups for e in range(g * per, (g + 1) * per)]
    chosen = sorted(allowed, key=lambda e: -sel[e].item())[:top_k]
    w = torch.stack([s[e] for e in chosen])
    if top_k > 1:
        w = w / w.sum()
    return chosen, (w * scale).float()


def ref_forward(m, ids, allowed):
    """Per-token reference logits; ``allowed[q, k]`` True = query q may attend key k."""
    cfg = m.config
    rdim = int(cfg.head_dim * cfg.partial_rotary_factor)
    x = m.model.word_embeddings.weight[ids].double()
    L = len(ids)
    for li, layer in enumerate(m.model.layers):
        att = layer.attention
        h = ref_rmsnorm(x, layer.input_layernorm.weight.double())
        W = att.query_key_value.weight.double()
        q = torch.zeros(L, H, HD, dtype=torch.double)
        k = torch.zeros(L, KV, HD, dtype=torch.double)
        v = torch.zeros(L, KV, HD, dtype=torch.double)
        for t in range(L):
            for hh in range(H):  # rows [Q heads | K heads | V heads], each head HD consecutive rows
                q[t, hh] = W[hh * HD : (hh + 1) * HD] @ h[t]
            for hh in range(KV):
                k[t, hh] = W[(H + hh) * HD : (H + hh + 1) * HD] @ h[t]
                v[t, hh] = W[(H + KV + hh) * HD : (H + KV + hh + 1) * HD] @ h[t]
            for hh in range(H):  # per-head norm first, then partial RoPE
                q[t, hh] = ref_rope_vec(
                    ref_rmsnorm(q[t, hh], att.query_layernorm.weight.double()), t, cfg.rope_theta, rdim
                )
            for hh in range(KV):
                k[t, hh] = ref_rope_vec(
                    ref_rmsnorm(k[t, hh], att.key_layernorm.weight.double()), t, cfg.rope_theta, rdim
                )
        out = torch.zeros(L, H * HD, dtype=torch.double)
        for t in range(L):
            for hh in range(H):
                kvh = hh // (H // KV)
                scores = torch.tensor(
                    [(q[t, hh] @ k[s, kvh]).item() / math.sqrt(HD) if allowed[t, s] else -math.inf for s in range(L)],
                    dtype=torch.double,
                )
                p = torch.softmax(scores, 0)
                out[t, hh * HD : (hh + 1) * HD] = (p[:, None] * v[:, kvh]).sum(0)
        x = x + out @ att.dense.weight.double().T
        h = ref_rmsnorm(x, layer.post_attention_layernorm.weight.double())
        if li < cfg.first_k_dense_replace:
            x = x + ref_mlp(h, _double(layer.mlp))
        else:
            moe = layer.mlp
            y = torch.zeros_like(x)
            for t in range(L):
                chosen, w = ref_route(
                    h[t].float(),
                    moe.gate,
                    cfg.n_group,
                    cfg.topk_group,
                    cfg.num_experts_per_tok,
                    cfg.routed_scaling_factor,
                )
                for e, we in zip(chosen, w.double()):
                    y[t] += we * ref_mlp(h[t], _double(moe.experts[e]))
                y[t] += ref_mlp(h[t], _double(moe.shared_experts))
            x = x + y
    x = ref_rmsnorm(x, m.model.norm.weight.double())
    return x @ m.lm_head.weight.double().T


def _double(mlp):
    d = LLaDA2MoeMLP(1, 1)
    d.gate_proj.weight = torch.nn.Parameter(mlp.gate_proj.weight.detach().double())
    d.up_proj.weight = torch.nn.Parameter(mlp.up_proj.weight.detach().double())
    d.down_proj.weight = torch.nn.Parameter(mlp.down_proj.weight.detach().double())
    return d


def _block_mask(L, block):
    pos = torch.arange(L)[None]
    return block_causal_mask(block_index(pos, block)), pos


# ----------------------------------------------------------------------------- facts
def test_full_forward_matches_hand_reference(model):
    ids = torch.tensor([5, 9, 2, 17, 33, 8, 41])
    mask, pos = _block_mask(len(ids), 3)
    got = model(ids[None], attention_mask=mask, position_ids=pos).logits[0]
    want = ref_forward(model, ids, mask[0, 0])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_partial_rope_rotates_only_the_first_half(model):
    torch.manual_seed(1)
    x = torch.randn(1, 2, 5, HD)
    pos = torch.arange(5)[None]
    cos, sin = rotary_cos_sin(pos, HD // 2, 10000.0, torch.float32)
    got = apply_partial_rotary(x, cos, sin)
    for t in range(5):
        for h in range(2):
            torch.testing.assert_close(
                got[0, h, t], ref_rope_vec(x[0, h, t], t, 10000.0, HD // 2), rtol=1e-5, atol=1e-5
            )
    assert torch.equal(got[..., HD // 2 :], x[..., HD // 2 :])
    assert model.config.rope_dim == HD // 2


def test_qk_norm_is_applied_before_rope(model):
    """Swapping the order (RoPE, then norm) changes the result when the norm weight is not uniform."""
    att = model.model.layers[0].attention
    torch.manual_seed(2)
    q = torch.randn(1, 1, 3, HD)
    pos = torch.tensor([[4, 5, 6]])
    cos, sin = rotary_cos_sin(pos, HD // 2, 10000.0, torch.float32)
    right = apply_partial_rotary(att.query_layernorm(q), cos, sin)
    wrong = att.query_layernorm(apply_partial_rotary(q, cos, sin))
    assert not torch.allclose(right, wrong, atol=1e-3)
    # the reference forward (norm then RoPE) is what the module computes
    ids = torch.tensor([3, 4, 5])
    mask, p = _block_mask(3, 4)
    torch.testing.assert_close(
        model(ids[None], attention_mask=mask, position_ids=p).logits[0].double(),
        ref_forward(model, ids, mask[0, 0]),
        rtol=1e-4,
        atol=1e-4,
    )


def test_fused_qkv_split_is_head_major_q_k_v(model):
    att = model.model.layers[0].attention
    assert att.query_key_value.weight.shape == ((H + 2 * KV) * HD, 16)
    x = torch.randn(1, 1, 16)
    qkv = att.query_key_value(x).view(1, 1, H + 2 * KV, HD)
    q, k, v = qkv.split([H, KV, KV], dim=2)
    W = att.query_key_value.weight
    torch.testing.assert_close(k[0, 0, 1], W[(H + 1) * HD : (H + 2) * HD] @ x[0, 0])
    torch.testing.assert_close(v[0, 0, 0], W[(H + KV) * HD : (H + KV + 1) * HD] @ x[0, 0])


def test_router_by_hand():
    """8 experts in 2 groups of 4; expert_bias flips the group choice; weights from unbiased sigmoid."""
    cfg = tiny_config(hidden_size=2)
    gate = LLaDA2MoeGate(cfg)
    with torch.no_grad():
        # x = (1, 0): logits = first column of W
        gate.weight.zero_()
        gate.weight[:, 0] = torch.tensor([2.0, 1.5, -1.0, -2.0, 1.0, 0.9, 0.8, -3.0])
        gate.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]))
    idx, w, logits = gate(torch.tensor([[1.0, 0.0]]))
    s = torch.sigmoid(torch.tensor([2.0, 1.5, -1.0, -2.0, 1.0, 0.9, 0.8, -3.0]))
    # group scores (selection = s + bias): g0 = s0 + s1 = 0.881 + 0.818; g1 = (s4+.5) + (s5+.5) = 1.731 + 1.711
    assert idx[0].tolist() == [4, 5]  # group 1 wins only because of the bias
    want = torch.stack([s[4], s[5]]) / (s[4] + s[5]) * 2.5  # unbiased weights, renormalised, x2.5
    torch.testing.assert_close(w[0], want)
    torch.testing.assert_close(w[0].sum(), torch.tensor(2.5))
    # without the bias, group 0 is chosen
    with torch.no_grad():
        gate.expert_bias.zero_()
    assert gate(torch.tensor([[1.0, 0.0]]))[0][0].tolist() == [0, 1]
    # expert_bias is a saved buffer
    assert "expert_bias" in dict(gate.named_buffers()) and "expert_bias" in gate.state_dict()


def test_single_expert_is_not_renormalised():
    cfg = tiny_config(hidden_size=2, num_experts_per_tok=1)
    gate = LLaDA2MoeGate(cfg)
    with torch.no_grad():
        gate.weight.zero_()
        gate.weight[:, 0] = torch.linspace(-1, 1, 8)
    idx, w, _ = gate(torch.tensor([[1.0, 0.0]]))
    assert idx[0].tolist() == [7]
    torch.testing.assert_close(w[0, 0], torch.sigmoid(torch.tensor(1.0)) * 2.5)


def test_moe_block_adds_shared_expert_always(model):
    moe = model.model.layers[1].mlp
    assert isinstance(moe, LLaDA2MoeSparseMoeBlock) and moe.shared_experts is not None
    x = torch.randn(5, 16)
    got = moe(x[None])[0]
    for t in range(5):
        chosen, w = ref_route(x[t], moe.gate, 2, 1, 2, 2.5)
        want = sum(wi * ref_mlp(x[t], e) for wi, e in zip(w, [moe.experts[c] for c in chosen]))
        want = want + ref_mlp(x[t], moe.shared_experts)
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)


def test_layer_zero_is_dense_and_the_rest_moe(model):
    assert isinstance(model.model.layers[0].mlp, LLaDA2MoeMLP)
    assert isinstance(model.model.layers[1].mlp, LLaDA2MoeSparseMoeBlock)
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (24, 16)
    assert model.model.layers[1].mlp.experts[0].gate_proj.weight.shape == (12, 16)


def test_no_shift_same_position_labels(model):
    ids = torch.tensor([[5, 9, 2, 17, 33, 8]])
    mask, pos = _block_mask(6, 3)
    out = model(ids, attention_mask=mask, position_ids=pos, labels=ids)
    ce = torch.nn.functional.cross_entropy(out.logits[0], ids[0])
    torch.testing.assert_close(out.loss, ce)


@pytest.mark.parametrize("bad", [None, "2d", "shape", "int"])
def test_missing_or_malformed_mask_is_an_error(model, bad):
    ids = torch.tensor([[5, 9, 2, 17]])
    mask = {
        None: None,
        "2d": torch.ones(1, 4),
        "shape": torch.ones(1, 1, 4, 3, dtype=torch.bool),
        "int": torch.ones(1, 1, 4, 4, dtype=torch.long),
    }[bad]
    with pytest.raises(LLaDA2MaskError):
        model(ids, attention_mask=mask)


def test_kv_cache_matches_full_forward(model):
    ids = torch.tensor([[5, 9, 2, 17, 33, 8, 41, 7, 3]])
    mask, pos = _block_mask(9, 3)
    full = model(ids, attention_mask=mask, position_ids=pos).logits
    pre = model(ids[:, :6], attention_mask=mask[:, :, :6, :6], position_ids=pos[:, :6], use_cache=True)
    cache = layers.output_cache(pre)
    assert len(cache) == 2 and cache[0][0].shape == (1, KV, 6, HD)
    out = model(
        ids[:, 6:], attention_mask=torch.ones(1, 9), position_ids=pos[:, 6:], past_key_values=cache, use_cache=True
    )
    torch.testing.assert_close(out.logits, full[:, 6:], rtol=1e-5, atol=1e-5)
    assert layers.output_cache(out)[0][0].shape[2] == 9


def test_eager_equals_sdpa_and_additive_equals_bool(model):
    ids = torch.tensor([[5, 9, 2, 17, 33, 8, 41]])
    mask, pos = _block_mask(7, 3)
    a = model(ids, attention_mask=mask, position_ids=pos).logits
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    b = model(ids, attention_mask=additive, position_ids=pos).logits
    model.config._attn_implementation = "eager"
    try:
        c = model(ids, attention_mask=mask, position_ids=pos).logits
    finally:
        model.config._attn_implementation = "sdpa"
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_config_rejects_unsupported_settings():
    with pytest.raises(LLaDA2ConfigError):
        tiny_config(rope_scaling={"type": "linear", "factor": 2.0})
    with pytest.raises(LLaDA2ConfigError):
        tiny_config(num_experts=6, n_group=4)  # 1 expert per group
    with pytest.raises(LLaDA2ConfigError):
        tiny_config(score_function="softmax")


def test_published_config_fields_load_without_remote_code(tmp_path):
    """A config.json with the published field names and auto_map resolves to the native classes."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    published = dict(tiny_config().to_dict())
    published.update(
        {
            "auto_map": {
                "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
            },
            "model_type": "llada2_moe",
            "score_function": "sigmoid",
            "router_dtype": "fp32",
            "moe_router_enable_expert_bias": True,
            "use_qk_norm": True,
            "norm_topk_prob": True,
        }
    )
    for key in ("mask_token_id", "eos_token_id"):  # not in the published config
        published.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(published))
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert type(cfg).__name__ == "LLaDA2MoeConfig" and cfg.mask_token_id == 156895 and cfg.eos_token_id == 156892
    assert type(AutoModelForCausalLM.from_config(cfg)).__name__ == "LLaDA2MoeModelLM"
    assert type(AutoModel.from_config(cfg)).__name__ == "LLaDA2MoeModel"


def test_sharded_save_load_round_trip_is_bit_exact(model, tmp_path):
    from transformers import AutoModel, AutoModelForCausalLM

    model.save_pretrained(tmp_path, max_shard_size="20KB")
    files = os.listdir(tmp_path)
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1
    index = json.load(open(tmp_path / "model.safetensors.index.json"))["weight_map"]
    names = set(index)
    assert {
        "model.word_embeddings.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.attention.query_key_value.weight",
        "model.layers.0.attention.query_layernorm.weight",
        "model.layers.0.attention.key_layernorm.weight",
        "model.layers.0.attention.dense.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.gate.expert_bias",
        "model.layers.1.mlp.experts.7.down_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight",
    } <= names
    with safe_open(str(tmp_path / index["model.layers.1.mlp.gate.expert_bias"]), "pt") as fh:
        torch.testing.assert_close(
            fh.get_tensor("model.layers.1.mlp.gate.expert_bias"),
            model.model.layers[1].mlp.gate.expert_bias,
            rtol=0,
            atol=0,
        )
    ids = torch.tensor([[5, 9, 2, 17, 33, 8, 41]])
    mask, pos = _block_mask(7, 3)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(again).__name__ == "LLaDA2MoeModelLM"
    torch.testing.assert_close(
        again(ids, attention_mask=mask, position_ids=pos).logits,
        model(ids, attention_mask=mask, position_ids=pos).logits,
        rtol=0,
        atol=0,
    )
    backbone = AutoModel.from_pretrained(tmp_path)
    torch.testing.assert_close(
        backbone(ids, attention_mask=mask, position_ids=pos).last_hidden_state,
        model.forward_hidden(ids, mask, pos),
        rtol=0,
        atol=0,
    )
    bf16 = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    assert bf16(ids, attention_mask=mask, position_ids=pos).logits.dtype == torch.float32
    bf16.save_pretrained(tmp_path / "bf16")
    again16 = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    for (n, a), (_, b) in zip(bf16.state_dict().items(), again16.state_dict().items()):
        assert torch.equal(a, b), n


def test_bf16_autocast_forward_and_backward(model):
    """Mixed-precision training: under CPU bf16 autocast the experts return bf16 while the MoE
    buffer keeps the float32 residual dtype; the forward must run, stay finite and close to the
    float32 result, and gradients must reach the routed experts."""
    ids = torch.randint(2, 48, (2, 8), generator=torch.Generator().manual_seed(3))
    mask, pos = _block_mask(8, 4)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, position_ids=pos).logits
    m = LLaDA2MoeModelLM(model.config)
    m.load_state_dict(model.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(ids, attention_mask=mask, position_ids=pos).logits
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref, atol=0.15, rtol=0.05)
    out.float().square().mean().backward()
    routed = [p.grad for n, p in m.named_parameters() if ".experts." in n and p.grad is not None]
    assert routed and any(bool(g.abs().sum() > 0) for g in routed)
