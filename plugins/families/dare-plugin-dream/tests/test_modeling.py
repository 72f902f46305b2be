"""Tests of the native Dream model (tiny random models, CPU, fp32 unless stated)."""

from __future__ import annotations

import functools
import json
import math
import os

import pytest
import torch
from safetensors.torch import save_file

from dare_nn.testing import module_checks as mc
from dare_plugin_dream.configuration_dream import DreamConfig
from dare_plugin_dream.hf import register_auto_classes
from dare_plugin_dream.modeling_dream import DreamModel

V = 32


def tiny_config(**overrides) -> DreamConfig:
    kw = dict(
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
        bos_token_id=V - 2,
    )
    kw.update(overrides)
    return DreamConfig(**kw)


def tiny_model(seed: int = 0, **overrides) -> DreamModel:
    """Random model whose weights (biases and norm weights included) are large enough to matter."""
    torch.manual_seed(seed)
    return mc.randomize_(DreamModel(tiny_config(**overrides)))


# ---------------------------------------------------------------------------
# Independent reference: plain float64 ops on the state dict, written from the published
# description (Qwen2 block, HF-Llama RMSNorm, NeoX RoPE, GQA, q/k/v biases), per head and loop.
# ---------------------------------------------------------------------------
def reference_logits(model: DreamModel, ids: torch.Tensor, key_mask=None, positions=None) -> torch.Tensor:
    cfg = model.config
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    d, H, KV = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = d // H
    B, L = ids.shape
    eps = cfg.rms_norm_eps
    pos = torch.arange(L, dtype=torch.float64) if positions is None else positions.double()

    def rms(t, w):
        return w * (t / torch.sqrt((t * t).mean(dim=-1, keepdim=True) + eps))

    inv = torch.tensor([cfg.rope_theta ** (-(2 * j) / hd) for j in range(hd // 2)], dtype=torch.float64)
    angle = pos[:, None] * inv[None, :]
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1)
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1)

    def rope(t):  # [B, L, heads, hd]
        lo, hi = t[..., : hd // 2], t[..., hd // 2 :]
        return t * cos[None, :, None, :] + torch.cat([-hi, lo], dim=-1) * sin[None, :, None, :]

    x = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = rope((h @ sd[p + "self_attn.q_proj.weight"].T + sd[p + "self_attn.q_proj.bias"]).reshape(B, L, H, hd))
        k = rope((h @ sd[p + "self_attn.k_proj.weight"].T + sd[p + "self_attn.k_proj.bias"]).reshape(B, L, KV, hd))
        v = (h @ sd[p + "self_attn.v_proj.weight"].T + sd[p + "self_attn.v_proj.bias"]).reshape(B, L, KV, hd)
        heads = []
        for head in range(H):
            g = head // (H // KV)
            s = torch.einsum("bqd,bkd->bqk", q[:, :, head], k[:, :, g]) / math.sqrt(hd)
            if key_mask is not None:
                s = s.masked_fill(~key_mask.bool()[:, None, :], float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[:, :, g])
        x = x + torch.stack(heads, dim=2).reshape(B, L, d) @ sd[p + "self_attn.o_proj.weight"].T
        g_in = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate = g_in @ sd[p + "mlp.gate_proj.weight"].T
        up = g_in @ sd[p + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"])
    return x @ sd["lm_head.weight"].T


_ids = functools.partial(mc.random_ids, V)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_forward_matches_hand_computation_one_layer(impl):
    model = tiny_model()
    ids = _ids()
    ref = mc.assert_matches_reference(model, impl, ids, reference_logits, V)
    # every ingredient matters: dropping the q bias or swapping RoPE halves changes the result
    sd = model.state_dict()
    with torch.no_grad():
        sd["model.layers.0.self_attn.q_proj.bias"].zero_()
    assert not torch.allclose(reference_logits(model, ids), ref, atol=1e-3)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_forward_matches_hand_computation_padding_positions_two_layers(impl):
    model = tiny_model(seed=3, num_hidden_layers=2, num_key_value_heads=1)
    model.set_attn_implementation(impl)
    ids = _ids(seed=4)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 5:] = 0
    mask[1, :2] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        pos = torch.tensor([3, 1, 4, 1, 5, 9, 2])
        shifted = model(ids, position_ids=pos).logits
    torch.testing.assert_close(out.double(), reference_logits(model, ids, key_mask=mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shifted.double(), reference_logits(model, ids, positions=pos), atol=1e-5, rtol=1e-5)
    mc.assert_padded_keys_invisible(model, ids, mask, out, V)


def test_bidirectional_raw_logits_are_ar_aligned_not_shifted():
    """The module returns raw logits: each position sees every other (no causal mask) and the
    module itself does not shift (that is the wrapper's job)."""
    model = tiny_model(seed=9)
    ids = _ids(b=1, l=6, seed=10)
    a, _ = mc.assert_bidirectional(model, ids, V)
    torch.testing.assert_close(a.double(), reference_logits(model, ids), atol=1e-5, rtol=1e-5)


def test_eager_equals_sdpa_for_all_mask_kinds():
    model = tiny_model(seed=7, num_hidden_layers=2)
    ids = _ids(seed=8)
    key, bool4, additive = mc.mask_kinds()
    mc.assert_eager_equals_sdpa(model, ids, [None, "full", key, key.long(), bool4, additive])
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask="full").logits, model(ids).logits, atol=0, rtol=0)
        torch.testing.assert_close(
            model(ids, attention_mask=bool4).logits, model(ids, attention_mask=additive).logits, atol=1e-6, rtol=0
        )


def test_invalid_inputs_raise():
    model = tiny_model()
    ids = _ids()
    for m in [
        torch.ones(2, 7, 7),
        torch.ones(2, 6),
        torch.full((2, 7), 2.0),
        torch.ones(2, 1, 7, 6, dtype=torch.bool),
        torch.ones(2, 1, 7, 7, dtype=torch.long),
        "causal",
    ]:
        with pytest.raises(ValueError):
            model(ids, attention_mask=m)
    for kw in (
        {"labels": ids},
        {"cu_seqlens": torch.tensor([0, 7])},
        {"output_attentions": True},
        {"position_ids": torch.arange(6)},
    ):
        with pytest.raises(ValueError):
            model(ids, **kw)


@pytest.mark.parametrize(
    "bad",
    [
        dict(hidden_act="gelu"),
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        dict(use_sliding_window=True),
        dict(num_key_value_heads=3),
        dict(hidden_size=18),
        dict(attention_dropout=0.1),
        dict(attn_implementation="flex_attention"),
        dict(pad_token_id=V),
    ],
)
def test_unsupported_config_raises(bad):
    with pytest.raises(ValueError):
        tiny_config(**bad)


# ---------------------------------------------------------------------------
# KV cache contract
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_cache_of_full_forward_reproduces_the_suffix(impl):
    """Bidirectional: keys/values of the prefix taken from the full forward + the suffix queried
    against them give exactly the full forward's suffix."""
    model = tiny_model(seed=11, num_hidden_layers=2)
    model.set_attn_implementation(impl)
    ids = _ids(l=9, seed=12)
    P = 5
    with torch.no_grad():
        full = model(ids, use_cache=True)
        assert len(full.past_key_values) == 2
        k0, v0 = full.past_key_values[0]
        assert k0.shape == (2, 2, 9, 4) and v0.shape == k0.shape
        cache = [(k[:, :, :P], v[:, :, :P]) for k, v in full.past_key_values]
        out = model(ids[:, P:], position_ids=torch.arange(P, 9), past_key_values=cache, use_cache=True)
        default_pos = model(ids[:, P:], past_key_values=cache)
    torch.testing.assert_close(out.logits, full.logits[:, P:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(default_pos.logits, out.logits, atol=0, rtol=0)  # default positions P..
    for (k, v), (kf, vf) in zip(out.past_key_values, full.past_key_values):
        assert k.shape[2] == 9
        torch.testing.assert_close(k, kf, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, vf, atol=1e-5, rtol=1e-5)
    # slots may be in any order: the position lives in RoPE
    perm = torch.tensor([3, 0, 4, 2, 1])
    shuffled = [(k[:, :, perm], v[:, :, perm]) for k, v in cache]
    with torch.no_grad():
        again = model(ids[:, P:], position_ids=torch.arange(P, 9), past_key_values=shuffled).logits
    torch.testing.assert_close(again, out.logits, atol=1e-5, rtol=1e-5)


def test_cache_with_masks_matches_masked_full_forward():
    """A prefix that only sees itself (block-causal layout) can be computed alone and cached; the
    suffix then matches the full forward under the same 4-D mask, also as bool [B,1,Q,P+Q] and
    with a 2-D key-padding mask over cache + new tokens."""
    model = tiny_model(seed=13, num_hidden_layers=2)
    ids = _ids(l=8, seed=14)
    P, L = 4, 8
    allow = torch.ones(L, L, dtype=torch.bool)
    allow[:P, P:] = False  # prefix cannot see the suffix
    with torch.no_grad():
        full = model(ids, attention_mask=allow[None, None].expand(2, 1, L, L)).logits
        prefix = model(ids[:, :P], use_cache=True)
        out = model(
            ids[:, P:],
            position_ids=torch.arange(P, L),
            past_key_values=prefix.past_key_values,
            attention_mask=allow[None, None, P:].expand(2, 1, L - P, L),
        ).logits
    torch.testing.assert_close(out, full[:, P:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefix.logits, full[:, :P], atol=1e-5, rtol=1e-5)
    # 2-D key padding over cache + new tokens (row 1: cached position 0 is padding)
    key = torch.ones(2, L, dtype=torch.long)
    key[1, 0] = 0
    allow2 = allow[None, None].expand(2, 1, L, L) & key.bool()[:, None, None, :]
    with torch.no_grad():
        full2 = model(ids, attention_mask=allow2).logits
        pre2 = model(ids[:, :P], attention_mask=key[:, :P], use_cache=True)
        out2 = model(
            ids[:, P:], position_ids=torch.arange(P, L), past_key_values=pre2.past_key_values, attention_mask=key
        ).logits
    torch.testing.assert_close(out2, full2[:, P:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        model(ids[:, P:], past_key_values=prefix.past_key_values, attention_mask=key[:, P:])
    with pytest.raises(ValueError):
        model(ids[:, P:], past_key_values=prefix.past_key_values[:1])


def test_forward_hidden_and_output_embeddings():
    model = tiny_model(seed=15, num_hidden_layers=2)
    ids = _ids(seed=16)
    mask = torch.ones(2, 7)
    mask[0, :2] = 0
    with torch.no_grad():
        hidden = model.forward_hidden(ids, attention_mask=mask, position_ids=torch.arange(7))
        logits = model(ids, attention_mask=mask).logits
        states = model(ids, output_hidden_states=True).hidden_states
    assert hidden.shape == (2, 7, 16)
    assert model.get_output_embeddings() is model.lm_head
    torch.testing.assert_close(model.get_output_embeddings()(hidden), logits, atol=0, rtol=0)
    assert len(states) == 3 and torch.equal(model.get_input_embeddings()(ids), states[0])


def test_tied_embeddings_share_the_head():
    model = DreamModel(tiny_config(tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    untied = DreamModel(tiny_config())
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


def test_padding_idx_row_starts_at_zero_and_gets_no_gradient():
    torch.manual_seed(0)
    model = DreamModel(tiny_config())
    pad = model.config.pad_token_id
    emb = model.get_input_embeddings()
    assert emb.padding_idx == pad and torch.equal(emb.weight[pad], torch.zeros(16))
    assert emb.weight[0].abs().sum() > 0
    ids = torch.tensor([[pad, 1, 2, pad]])
    model(ids).logits.sum().backward()
    assert torch.equal(emb.weight.grad[pad], torch.zeros(16)) and emb.weight.grad[1].abs().sum() > 0


def test_bf16_forward_close_to_fp32():
    mc.assert_bf16_close_to_fp32(tiny_model(seed=17, num_hidden_layers=2), _ids())


def test_gradient_checkpointing_same_gradients():
    model = tiny_model(seed=31, num_hidden_layers=2)
    mc.assert_gradient_checkpointing_same_gradients(model, _ids(seed=32), _ids(seed=33), model.model.layers)


# ---------------------------------------------------------------------------
# Config / serialization
# ---------------------------------------------------------------------------
def test_default_config_is_dream_v0_instruct_7b():
    c = DreamConfig()
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (
        3584,
        18944,
        28,
        28,
        4,
    )
    assert (c.vocab_size, c.max_position_embeddings, c.rope_theta, c.rms_norm_eps) == (152064, 131072, 1e6, 1e-6)
    assert (c.mask_token_id, c.pad_token_id, c.bos_token_id, c.eos_token_id) == (151666, 151643, 151643, 151643)
    assert c.tie_word_embeddings is False and c.rope_scaling is None and c.head_dim == 128
    assert DreamConfig(attn_implementation="flash_attention_2")._attn_implementation == "sdpa"


def test_state_dict_names_match_published_pattern():
    n = 3
    sd = DreamModel(tiny_config(num_hidden_layers=n)).state_dict()
    expected = {"model.embed_tokens.weight": (V, 16), "model.norm.weight": (16,), "lm_head.weight": (V, 16)}
    for i in range(n):
        p = f"model.layers.{i}."
        expected.update(
            {
                p + "input_layernorm.weight": (16,),
                p + "post_attention_layernorm.weight": (16,),
                p + "self_attn.q_proj.weight": (16, 16),
                p + "self_attn.q_proj.bias": (16,),
                p + "self_attn.k_proj.weight": (8, 16),
                p + "self_attn.k_proj.bias": (8,),
                p + "self_attn.v_proj.weight": (8, 16),
                p + "self_attn.v_proj.bias": (8,),
                p + "self_attn.o_proj.weight": (16, 16),
                p + "mlp.gate_proj.weight": (24, 16),
                p + "mlp.up_proj.weight": (24, 16),
                p + "mlp.down_proj.weight": (16, 24),
            }
        )
    assert len(sd) == 12 * n + 3
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected


def test_save_load_roundtrip_sharded_bit_exact(tmp_path):
    from transformers import AutoModel

    register_auto_classes()
    register_auto_classes()  # idempotent
    model = tiny_model(seed=21, num_hidden_layers=2)
    cfg = mc.assert_save_load_roundtrip(model, _ids(), tmp_path, [AutoModel], DreamConfig)
    assert cfg["model_type"] == "Dream" and cfg["architectures"] == ["DreamModel"]
    for key in ("hidden_size", "num_key_value_heads", "rope_theta", "tie_word_embeddings", "mask_token_id"):
        assert key in cfg


def test_bf16_save_load_roundtrip(tmp_path):
    register_auto_classes()
    mc.assert_bf16_save_load_roundtrip(tiny_model(seed=22).to(torch.bfloat16), _ids(), tmp_path)


def test_published_style_checkpoint_loads_without_remote_code(tmp_path):
    """A config.json as published (auto_map to remote code, flash_attention_2, torch_dtype)
    resolves to the native class, sharded with an index."""
    from transformers import AutoModel

    register_auto_classes()
    model = tiny_model(seed=23, num_hidden_layers=2)
    cfg = {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": V - 2,
        "eos_token_id": V - 2,
        "hidden_act": "silu",
        "hidden_size": 16,
        "initializer_range": 0.02,
        "intermediate_size": 24,
        "mask_token_id": V - 1,
        "max_position_embeddings": 64,
        "max_window_layers": 2,
        "model_type": "Dream",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": V - 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.46.2",
        "use_cache": False,
        "use_sliding_window": False,
        "vocab_size": V,
        "attn_implementation": "flash_attention_2",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(sd)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, os.fspath(tmp_path / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in keys})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is DreamModel and loaded.config._attn_implementation == "sdpa"
    mc.assert_same_weights(model, loaded)
