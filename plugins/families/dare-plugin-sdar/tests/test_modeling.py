"""SDAR / SDAR-MoE facts (arXiv:2510.06303) on 1-2 layer models against hand computations.

The reference forward below is written from the published description only (plain tensor ops, no
import of the modules under test): Qwen3 block with per-head q/k RMSNorm *before* NeoX RoPE, RMSNorm
that multiplies the weight in fp32, explicit head_dim, GQA, a caller-supplied boolean mask, unshifted
logits; MoE = fp32 softmax router, top-k, renormalised, no shared expert.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from dare_plugin_sdar.configuration_sdar import SDARConfig, SDARMoeConfig
from dare_plugin_sdar.hf import register_auto_classes
from dare_plugin_sdar.modeling_sdar import SDARForCausalLM, SDARModel, SDARRMSNorm
from dare_plugin_sdar.modeling_sdar_moe import SDARMoeForCausalLM, SDARMoeModel, SDARMoeSparseMoeBlock, route

register_auto_classes()  # AutoConfig / AutoModel* resolve the native classes

DENSE = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    mask_token_id=96,
    eos_token_id=1,
    bos_token_id=1,
)
MOE = dict(DENSE, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=24)


def _randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))  # weights != 1 so order matters
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def dense():
    torch.manual_seed(0)
    return _randomize(SDARForCausalLM(SDARConfig(**DENSE))).eval()


@pytest.fixture(scope="module")
def moe():
    torch.manual_seed(0)
    return _randomize(SDARMoeForCausalLM(SDARMoeConfig(**MOE)), seed=1).eval()


# ----------------------------------------------------------------------------- hand reference
def _rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _rope(x, pos, theta):
    hd = x.shape[-1]
    half = hd // 2
    freqs = torch.tensor([theta ** (-(2.0 * j) / hd) for j in range(half)], dtype=torch.float32)
    ang = pos.float()[..., None] * freqs  # [B, L, half]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]  # [B, 1, L, half]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _swiglu(x, sd, prefix):
    g = x @ sd[prefix + "gate_proj.weight"].T
    u = x @ sd[prefix + "up_proj.weight"].T
    return (g * torch.sigmoid(g) * u) @ sd[prefix + "down_proj.weight"].T


def _moe_mlp(x, sd, prefix, cfg):
    flat = x.reshape(-1, x.shape[-1])
    logits = flat @ sd[prefix + "gate.weight"].T
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        p = torch.softmax(logits[n].double(), -1)
        top = sorted(range(cfg["num_experts"]), key=lambda e: -float(p[e]))[: cfg["num_experts_per_tok"]]
        z = sum(float(p[e]) for e in top)
        for e in top:
            out[n] += (float(p[e]) / z) * _swiglu(flat[n], sd, f"{prefix}experts.{e}.")
    return out.reshape(x.shape)


def reference_logits(sd, cfg, ids, mask, pos, moe=False):
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    h = sd["model.embed_tokens.weight"][ids]
    B, L, _ = h.shape
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = _rms(h, sd[p + "input_layernorm.weight"])
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(B, L, H, hd)
        k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(B, L, KV, hd)
        v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(B, L, KV, hd)
        q = _rms(q, sd[p + "self_attn.q_norm.weight"]).transpose(1, 2)  # norm per head, then RoPE
        k = _rms(k, sd[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        q, k = _rope(q, pos, cfg["rope_theta"]), _rope(k, pos, cfg["rope_theta"])
        v = v.transpose(1, 2)
        heads = []
        for head in range(H):
            kvh = head // (H // KV)
            s = q[:, head] @ k[:, kvh].transpose(-1, -2) / hd**0.5
            s = s.masked_fill(~mask[:, 0], float("-inf"))
            heads.append(torch.softmax(s, -1) @ v[:, kvh])
        a = torch.stack(heads, 1).transpose(1, 2).reshape(B, L, H * hd)
        h = h + a @ sd[p + "self_attn.o_proj.weight"].T
        y = _rms(h, sd[p + "post_attention_layernorm.weight"])
        h = h + (_moe_mlp(y, sd, p + "mlp.", cfg) if moe else _swiglu(y, sd, p + "mlp."))
    h = _rms(h, sd["model.norm.weight"])
    return h @ sd["lm_head.weight"].T


def _block_causal(L, bs):
    b = torch.arange(L) // bs
    return (b[None, :] <= b[:, None])[None, None]


def _ids(L=11, B=2, seed=0):
    return torch.randint(2, 90, (B, L), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- facts
@pytest.mark.parametrize("which", ["dense", "moe"])
def test_forward_matches_hand_reference(which, dense, moe):
    model, cfg = (dense, DENSE) if which == "dense" else (moe, MOE)
    ids = _ids()
    mask = _block_causal(11, 4).expand(2, 1, 11, 11)
    pos = torch.arange(11).expand(2, 11)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
        want = reference_logits(sd, cfg, ids, mask, pos, moe=which == "moe")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_head_dim_is_explicit(dense):
    # 4 heads x 16 = 64 != hidden 48 (like SDAR-4B: 32 x 128 on a 2560 hidden)
    attn = dense.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (64, 48) and attn.k_proj.weight.shape == (32, 48)
    assert attn.o_proj.weight.shape == (48, 64) and attn.q_norm.weight.shape == (16,)
    assert attn.scaling == 16**-0.5


def test_qk_norm_is_applied_before_rope(dense):
    """Norm-then-RoPE (the reference) matches; RoPE-then-norm (weights != 1) does not."""
    attn = dense.model.layers[0].self_attn
    x = torch.randn(1, 6, 48)
    pos = torch.arange(6)[None] + 3
    q = attn.q_proj(x).view(1, 6, 4, 16)
    right = _rope(_rms(q, attn.q_norm.weight).transpose(1, 2), pos, 10000.0)
    wrong = _rms(_rope(q.transpose(1, 2), pos, 10000.0), attn.q_norm.weight)
    assert not torch.allclose(right, wrong, atol=1e-3)
    # the query that enters attention, through the module's own pieces
    from dare_plugin_sdar.modeling_sdar import _apply_rope, rope_cos_sin

    cos, sin = rope_cos_sin(pos, 16, 10000.0, torch.float32)
    mine = _apply_rope(attn.q_norm(q).transpose(1, 2), cos, sin)
    torch.testing.assert_close(mine, right, rtol=1e-5, atol=1e-5)


def test_rmsnorm_multiplies_the_weight_in_fp32():
    norm = SDARRMSNorm(64).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(1.0 + torch.randn(64))
    x = torch.randn(32, 64).to(torch.bfloat16)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    fp32_weight = (normed * norm.weight.float()).to(torch.bfloat16)
    cast_first = norm.weight * normed.to(torch.bfloat16)  # HF Qwen3 order
    out = norm(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, fp32_weight)
    assert not torch.equal(out, cast_first)


def test_router_softmax_topk_renormalised_in_fp32():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 5, generator=g).to(torch.bfloat16)
    w, e = route(logits, 2, True, torch.bfloat16)
    for n in range(7):
        p = torch.softmax(logits[n].float(), -1)
        top = torch.topk(p, 2)
        assert e[n].tolist() == top.indices.tolist()
        want = (top.values / top.values.sum()).to(torch.bfloat16)
        assert torch.equal(w[n], want)
    w2, _ = route(logits.float(), 2, False, torch.float32)
    torch.testing.assert_close(w2.sum(-1) < 1, torch.ones(7, dtype=torch.bool))


def test_moe_block_and_no_shared_expert(moe):
    block = moe.model.layers[0].mlp
    assert isinstance(block, SDARMoeSparseMoeBlock)
    assert not [k for k in moe.state_dict() if "shared" in k]
    assert moe.state_dict()["model.layers.1.mlp.gate.weight"].shape == (5, 48)
    x = torch.randn(2, 3, 48)
    sd = {k: v.detach() for k, v in moe.state_dict().items()}
    with torch.no_grad():
        out, router = block(x)
        want = _moe_mlp(x, sd, "model.layers.0.mlp.", MOE)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert router.shape == (6, 5)


def test_mlp_only_layers_are_dense():
    cfg = SDARMoeConfig(**dict(MOE, mlp_only_layers=[0]))
    m = SDARMoeForCausalLM(cfg)
    assert not isinstance(m.model.layers[0].mlp, SDARMoeSparseMoeBlock)
    assert isinstance(m.model.layers[1].mlp, SDARMoeSparseMoeBlock)


def test_mask_is_required_and_validated(dense):
    ids = _ids(8, 1)
    with pytest.raises(ValueError, match="explicit attention_mask"):
        dense(ids)
    additive = torch.zeros(1, 1, 8, 8).masked_fill(~_block_causal(8, 4), float("-inf"))
    with pytest.raises(ValueError, match="0/1"):
        dense(ids, attention_mask=additive)
    with pytest.raises(ValueError, match="does not match"):
        dense(ids, attention_mask=torch.ones(1, 1, 8, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="padding mask"):
        dense(ids, attention_mask=torch.ones(1, 7))
    # a 0/1 integer mask is read like the boolean one; 3-D (1, L, K) broadcasts
    with torch.no_grad():
        a = dense(ids, attention_mask=_block_causal(8, 4)).logits
        b = dense(ids, attention_mask=_block_causal(8, 4).long()).logits
        c = dense(ids, attention_mask=_block_causal(8, 4)[:, 0]).logits
    assert torch.equal(a, b) and torch.equal(a, c)


def test_logits_not_shifted_and_attention_follows_the_mask(dense):
    ids = _ids(12, 1)
    mask = _block_causal(12, 4)
    with torch.no_grad():
        base = dense(ids, attention_mask=mask).logits
        later = ids.clone()
        later[0, 9] = 3  # block 2
        out = dense(later, attention_mask=mask).logits
        same = ids.clone()
        same[0, 6] = 3  # block 1, after position 4
        out2 = dense(same, attention_mask=mask).logits
    assert torch.equal(out[:, :8], base[:, :8])
    assert not torch.allclose(out2[0, 4], base[0, 4])  # bidirectional inside the block
    # unshifted: the token at position 0 influences logit 0 (a shifted model's logit 0 sees nothing new)
    first = ids.clone()
    first[0, 0] = 3
    with torch.no_grad():
        out3 = dense(first, attention_mask=mask).logits
    assert not torch.allclose(out3[0, 0], base[0, 0])


def test_kv_cache_contract(dense):
    ids = _ids(12, 2)
    pos = torch.arange(12).expand(2, 12)
    full_mask = _block_causal(12, 4).expand(2, 1, 12, 12)
    with torch.no_grad():
        full = dense(ids, attention_mask=full_mask, use_cache=True)
        pre = dense(ids[:, :8], attention_mask=full_mask[:, :, :8, :8], position_ids=pos[:, :8], use_cache=True)
        nxt = dense(
            ids[:, 8:],
            attention_mask=torch.ones(2, 1, 4, 12, dtype=torch.bool),
            past_key_values=pre.past_key_values,
            use_cache=True,
        )  # positions default to 8..11
    torch.testing.assert_close(nxt.logits, full.logits[:, 8:], rtol=1e-5, atol=1e-5)
    assert len(nxt.past_key_values) == 2
    k, v = nxt.past_key_values[1]
    assert k.shape == (2, 2, 12, 16)
    torch.testing.assert_close(k, full.past_key_values[1][0], rtol=1e-5, atol=1e-5)
    # cached keys are after q/k-norm and RoPE: recompute layer 0's keys by hand
    sd = dense.state_dict()
    x = _rms(dense.model.embed_tokens(ids), sd["model.layers.0.input_layernorm.weight"])
    kk = (x @ sd["model.layers.0.self_attn.k_proj.weight"].T).view(2, 12, 2, 16)
    kk = _rope(_rms(kk, sd["model.layers.0.self_attn.k_norm.weight"]).transpose(1, 2), pos, 10000.0)
    torch.testing.assert_close(full.past_key_values[0][0], kk, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one \\(key, value\\) pair per layer"):
        dense(ids[:, 8:], attention_mask=torch.ones(2, 12), past_key_values=object())


def test_eager_equals_sdpa_and_hidden_head(dense):
    # bit-exact comparisons across different GEMM shapes (10 rows vs the last 3) hold only when
    # BLAS does not split the work over threads differently; pin one thread for this test
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _eager_equals_sdpa_and_hidden_head(dense)
    finally:
        torch.set_num_threads(threads)


def _eager_equals_sdpa_and_hidden_head(dense):
    ids = _ids(10, 2)
    mask = _block_causal(10, 4)
    with torch.no_grad():
        sdpa = dense(ids, attention_mask=mask).logits
        dense.config._attn_implementation = "eager"
        try:
            eager = dense(ids, attention_mask=mask).logits
        finally:
            dense.config._attn_implementation = "sdpa"
        hidden = dense.forward_hidden(ids, mask)
    torch.testing.assert_close(eager, sdpa, rtol=1e-5, atol=1e-5)
    assert dense.get_output_embeddings() is dense.lm_head
    torch.testing.assert_close(dense.get_output_embeddings()(hidden), sdpa, rtol=0, atol=0)
    with torch.no_grad():
        last = dense(ids, attention_mask=mask, logits_to_keep=3).logits
    torch.testing.assert_close(last, sdpa[:, -3:], rtol=0, atol=0)


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_save_load_round_trip_sharded(which, dense, moe, tmp_path):
    model = dense if which == "dense" else moe
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    files = os.listdir(tmp_path)
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["model_type"] == model.config.model_type and cfg["head_dim"] == 16
    assert "auto_map" not in cfg
    ids = _ids(9, 2)
    mask = _block_causal(9, 4)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(again) is type(model)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
        base = AutoModel.from_pretrained(tmp_path)
        assert type(base) is (SDARModel if which == "dense" else SDARMoeModel)
        assert torch.equal(base(ids, attention_mask=mask).last_hidden_state, model.forward_hidden(ids, mask))
    bf16 = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        lb = bf16(ids, attention_mask=mask).logits
    assert lb.dtype == torch.bfloat16
    torch.testing.assert_close(lb.float(), model(ids, attention_mask=mask).logits, rtol=0.1, atol=0.15)


def test_published_config_loads_without_remote_code(tmp_path):
    """A config.json with the published SDAR-4B field names (sizes shrunk) and its auto_map."""
    cfg = {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_implementation": "flex_attention",
        "bos_token_id": 5,
        "debug": False,
        "eos_token_id": 5,
        "block_size": 4,
        "mask_token_id": 7,
        "ep_size": 1,
        "fuse_cross_entropy": True,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 40,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
        "max_window_layers": 2,
        "micro_forward": False,
        "model_type": "sdar",
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "skip_checkpoint": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.52.4",
        "use_cache": False,
        "use_deepep": False,
        "use_sliding_window": False,
        "vocab_size": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    conf = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(conf, SDARConfig) and conf.head_dim == 16 and conf.block_size == 4
    assert conf.rope_theta == 1000000 and conf._attn_implementation in (None, "sdpa")
    model = AutoModelForCausalLM.from_config(conf)
    assert isinstance(model, SDARForCausalLM)
    assert model.config.to_dict()["attn_implementation"] == "flex_attention"  # kept for the published code
    moe_cfg = SDARMoeConfig()
    assert moe_cfg.block_size is None and moe_cfg.mask_token_id is None and moe_cfg.norm_topk_prob


def test_unsupported_settings_are_rejected():
    with pytest.raises(ValueError, match="rope_scaling"):
        SDARConfig(**dict(DENSE, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match="attention_bias"):
        SDARConfig(**dict(DENSE, attention_bias=True))
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        SDARMoeConfig(**dict(MOE, num_experts_per_tok=9))
    m = SDARForCausalLM(SDARConfig(**DENSE))
    with pytest.raises(ValueError, match="labels"):
        m(_ids(4, 1), attention_mask=torch.ones(1, 4), labels=_ids(4, 1))
