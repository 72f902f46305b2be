"""Tests of the native LLaDA model (tiny random models, CPU, fp32 unless stated)."""

from __future__ import annotations

import functools
import json
import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from dare_nn.testing import module_checks as mc
from dare_plugin_llada.configuration_llada import LLaDAConfig
from dare_plugin_llada.hf import register_auto_classes
from dare_plugin_llada.modeling_llada import LLaDAModelLM

V = 32


def tiny_config(**overrides) -> LLaDAConfig:
    kw = dict(
        d_model=16,
        n_heads=2,
        n_kv_heads=2,
        n_layers=1,
        mlp_hidden_size=24,
        vocab_size=V,
        embedding_size=V,
        max_sequence_length=64,
        rope_theta=10000.0,
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
        bos_token_id=V - 3,
    )
    kw.update(overrides)
    return LLaDAConfig(**kw)


def tiny_model(seed: int = 0, **overrides) -> LLaDAModelLM:
    """Random model whose weights are large enough to make every term matter."""
    torch.manual_seed(seed)
    model = LLaDAModelLM(tiny_config(**overrides))
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    return mc.randomize_(model, ("norm.weight", "ln_f.weight"))


# ---------------------------------------------------------------------------
# Independent reference: plain torch ops on the state dict, in float64.
# ---------------------------------------------------------------------------
def reference_logits(model: LLaDAModelLM, ids: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    cfg = model.config
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    d, H = cfg.d_model, cfg.n_heads
    KV = cfg.n_kv_heads
    hd = d // H
    B, L = ids.shape
    eps = cfg.rms_norm_eps

    def rms(t, w):
        return w * (t / torch.sqrt((t * t).mean(dim=-1, keepdim=True) + eps))

    inv_freq = torch.tensor([1.0 / (cfg.rope_theta ** (2 * j / hd)) for j in range(hd // 2)], dtype=torch.float64)
    angle = torch.outer(torch.arange(L, dtype=torch.float64), inv_freq)  # [L, hd/2]
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1)  # [L, hd]
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1)

    def rope(t):  # t: [B, L, heads, hd]
        lo, hi = t[..., : hd // 2], t[..., hd // 2 :]
        rotated = torch.cat([-hi, lo], dim=-1)
        return t * cos[None, :, None, :] + rotated * sin[None, :, None, :]

    x = sd["model.transformer.wte.weight"][ids]
    for i in range(cfg.n_layers):
        p = f"model.transformer.blocks.{i}."
        h = rms(x, sd[p + "attn_norm.weight"])
        q = rope((h @ sd[p + "q_proj.weight"].T).reshape(B, L, H, hd))
        k = rope((h @ sd[p + "k_proj.weight"].T).reshape(B, L, KV, hd))
        v = (h @ sd[p + "v_proj.weight"].T).reshape(B, L, KV, hd)
        heads = []
        for head in range(H):
            kv = head // (H // KV)
            s = torch.einsum("bqd,bkd->bqk", q[:, :, head], k[:, :, kv]) / math.sqrt(hd)
            if key_mask is not None:
                s = s.masked_fill(~key_mask.bool()[:, None, :], float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[:, :, kv])
        att = torch.stack(heads, dim=2).reshape(B, L, d)
        x = x + att @ sd[p + "attn_out.weight"].T
        g = rms(x, sd[p + "ff_norm.weight"])
        gate = g @ sd[p + "ff_proj.weight"].T
        up = g @ sd[p + "up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ sd[p + "ff_out.weight"].T
    x = rms(x, sd["model.transformer.ln_f.weight"])
    return x @ sd["model.transformer.ff_out.weight"].T


_ids = functools.partial(mc.random_ids, V)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_forward_matches_hand_computation_one_layer(impl):
    mc.assert_matches_reference(tiny_model(), impl, _ids(), reference_logits, V)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_forward_matches_hand_computation_with_padding(impl):
    model = tiny_model(seed=3)
    model.set_attn_implementation(impl)
    ids = _ids(seed=4)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 5:] = 0
    mask[1, :2] = 0  # left padding
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        unmasked = model(ids).logits
    ref = reference_logits(model, ids, key_mask=mask)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, unmasked)
    # Padded keys are excluded: changing the padded tokens leaves every logit unchanged.
    mc.assert_padded_keys_invisible(model, ids, mask, out, V)
    # An all-ones 2D mask (any dtype) is the same as no mask.
    with torch.no_grad():
        for m in (torch.ones(2, 7), torch.ones(2, 7, dtype=torch.bool)):
            torch.testing.assert_close(model(ids, attention_mask=m).logits, unmasked, atol=0, rtol=0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_forward_matches_hand_computation_gqa_two_layers(impl):
    model = tiny_model(seed=5, n_layers=2, n_heads=4, n_kv_heads=2)
    model.set_attn_implementation(impl)
    assert model.model.transformer.blocks[0].k_proj.weight.shape == (8, 16)
    ids = _ids(seed=6)
    mask = torch.ones(2, 7)
    mask[1, 4:] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits.double(), reference_logits(model, ids), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            model(ids, attention_mask=mask).logits.double(),
            reference_logits(model, ids, key_mask=mask),
            atol=1e-5,
            rtol=1e-5,
        )


def test_state_dict_names_match_published_pattern():
    n = 3
    model = LLaDAModelLM(tiny_config(n_layers=n, n_heads=4, n_kv_heads=2))
    sd = model.state_dict()
    expected = {
        "model.transformer.wte.weight": (V, 16),
        "model.transformer.ln_f.weight": (16,),
        "model.transformer.ff_out.weight": (V, 16),
    }
    for i in range(n):
        p = f"model.transformer.blocks.{i}."
        expected.update(
            {
                p + "attn_norm.weight": (16,),
                p + "q_proj.weight": (16, 16),
                p + "k_proj.weight": (8, 16),
                p + "v_proj.weight": (8, 16),
                p + "attn_out.weight": (16, 16),
                p + "ff_norm.weight": (16,),
                p + "ff_proj.weight": (24, 16),
                p + "up_proj.weight": (24, 16),
                p + "ff_out.weight": (16, 24),
            }
        )
    assert len(sd) == n * 9 + 3
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected
    assert model.get_input_embeddings() is model.model.transformer.wte
    assert model.get_output_embeddings() is model.model.transformer.ff_out
    assert model.model.transformer.ff_out.weight.data_ptr() != model.model.transformer.wte.weight.data_ptr()


def test_default_init_is_small_normal():
    torch.manual_seed(0)
    model = LLaDAModelLM(tiny_config(d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden_size=128, init_std=0.02))
    w = model.model.transformer.blocks[0].ff_proj.weight
    assert abs(w.std().item() - 0.02) < 0.003 and abs(w.mean().item()) < 0.003
    assert abs(model.model.transformer.wte.weight.std().item() - 0.02) < 0.004
    assert torch.equal(model.model.transformer.ln_f.weight, torch.ones(64))
    with torch.no_grad():
        logits = model(_ids()).logits
    assert torch.isfinite(logits).all() and logits.abs().max() < 1.0


def test_eager_equals_sdpa_for_all_mask_kinds():
    model = tiny_model(seed=7, n_layers=2, n_heads=4, n_kv_heads=1)
    ids = _ids(seed=8)
    key, bool4, additive = mc.mask_kinds()
    mc.assert_eager_equals_sdpa(model, ids, [None, key, key.long(), bool4, additive, torch.randn(1, 4, 7, 7)])
    # 4D bool and its additive twin give the same result.
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, attention_mask=bool4).logits, model(ids, attention_mask=additive).logits, atol=1e-6, rtol=0
        )


def test_attn_implementation_selection():
    assert LLaDAModelLM(tiny_config()).config._attn_implementation == "sdpa"
    assert LLaDAModelLM(tiny_config(attn_implementation="eager")).config._attn_implementation == "eager"
    model = LLaDAModelLM(tiny_config())
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError):
        tiny_config(attn_implementation="flash_attention_2")


def test_bidirectional_and_unshifted():
    model = tiny_model(seed=9)
    ids = _ids(b=1, l=6, seed=10)
    # A later token changes the logits of every earlier position (no causal mask).
    a, _ = mc.assert_bidirectional(model, ids, V)
    # The permutation-equivariant part: logits are per position, same length as the input.
    assert a.shape[1] == ids.shape[1]


def test_position_ids_and_packing():
    model = tiny_model(seed=11)
    ids = _ids(b=1, l=8, seed=12)
    with torch.no_grad():
        base = model(ids).logits
        torch.testing.assert_close(model(ids, position_ids=torch.arange(8)[None]).logits, base, atol=0, rtol=0)
        torch.testing.assert_close(model(ids, position_ids=torch.arange(8)).logits, base, atol=0, rtol=0)
        assert not torch.allclose(model(ids, position_ids=torch.arange(8)[None] + 3).logits, base)
        # Two sequences packed in one row: restarted positions + block-diagonal mask == separate forwards.
        first, second = ids[:, :5], ids[:, 5:]
        pos = torch.cat([torch.arange(5), torch.arange(3)])[None]
        seg = torch.tensor([0] * 5 + [1] * 3)
        block = (seg[:, None] == seg[None, :])[None, None]
        packed = model(ids, attention_mask=block, position_ids=pos).logits
        torch.testing.assert_close(packed[:, :5], model(first).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed[:, 5:], model(second).logits, atol=1e-5, rtol=1e-5)


def test_invalid_masks_and_kwargs_raise():
    model = tiny_model()
    ids = _ids()
    bad_masks = [
        torch.ones(2, 7, 7),
        torch.ones(2, 6),
        torch.full((2, 7), 2.0),
        torch.zeros(2, 7) - 1e9,
        torch.ones(2, 1, 7, 6, dtype=torch.bool),
        torch.ones(2, 1, 7, 7, dtype=torch.long),
        [[1] * 7] * 2,
    ]
    for m in bad_masks:
        with pytest.raises(ValueError):
            model(ids, attention_mask=m)
    for kw in (
        {"past_key_values": object()},
        {"labels": ids},
        {"cu_seqlens": torch.tensor([0, 7])},
        {"output_attentions": True},
    ):
        with pytest.raises(ValueError):
            model(ids, **kw)


def test_outputs_tuple_and_hidden_states():
    model = tiny_model(n_layers=2)
    ids = _ids()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        tup = model(ids, return_dict=False)
        emb = model(inputs_embeds=model.get_input_embeddings()(ids)).logits
    assert len(out.hidden_states) == 3 and out.hidden_states[0].shape == (2, 7, 16)
    torch.testing.assert_close(model.get_output_embeddings()(out.hidden_states[-1]), out.logits)
    assert isinstance(tup, tuple) and torch.equal(tup[0], out.logits)
    torch.testing.assert_close(emb, out.logits, atol=0, rtol=0)


def test_bf16_forward_close_to_fp32():
    mc.assert_bf16_close_to_fp32(tiny_model(seed=13, n_layers=2), _ids())


# ---------------------------------------------------------------------------
# Config / serialization
# ---------------------------------------------------------------------------
PUBLISHED_KEYS = [
    "d_model",
    "n_heads",
    "n_kv_heads",
    "n_layers",
    "mlp_hidden_size",
    "mlp_ratio",
    "activation_type",
    "block_type",
    "layer_norm_type",
    "rms_norm_eps",
    "layer_norm_with_affine",
    "bias_for_layer_norm",
    "include_bias",
    "include_qkv_bias",
    "attention_layer_norm",
    "rope",
    "rope_theta",
    "rope_full_precision",
    "alibi",
    "weight_tying",
    "scale_logits",
    "input_emb_norm",
    "embedding_size",
    "vocab_size",
    "max_sequence_length",
    "flash_attention",
    "mask_token_id",
    "pad_token_id",
    "eos_token_id",
    "use_cache",
]


def test_default_config_is_llada_8b_instruct():
    c = LLaDAConfig()
    assert (c.d_model, c.n_heads, c.n_kv_heads, c.n_layers, c.mlp_hidden_size) == (4096, 32, 32, 32, 12288)
    assert (c.vocab_size, c.embedding_size, c.max_sequence_length) == (126464, 126464, 4096)
    assert (c.rms_norm_eps, c.rope_theta, c.mask_token_id, c.eos_token_id, c.pad_token_id) == (
        1e-5,
        500000.0,
        126336,
        126081,
        126081,
    )
    assert (c.activation_type, c.block_type, c.layer_norm_type) == ("silu", "llama", "rms")
    assert c.weight_tying is False and c.tie_word_embeddings is False and c.use_cache is False
    assert (c.hidden_size, c.num_attention_heads, c.num_hidden_layers, c.num_key_value_heads) == (4096, 32, 32, 32)
    assert LLaDAConfig(n_kv_heads=8).num_key_value_heads == 8
    for prop in ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads"):
        with pytest.raises(AttributeError):
            setattr(c, prop, 1)


@pytest.mark.parametrize(
    "bad",
    [
        dict(alibi=True),
        dict(include_bias=True),
        dict(d_model=18, n_heads=4, n_kv_heads=4),
        dict(n_kv_heads=3),
        dict(weight_tying=True),
        dict(block_type="sequential"),
        dict(activation_type="gelu"),
        dict(layer_norm_type="default"),
        dict(attention_layer_norm=True),
        dict(rope=False),
        dict(input_emb_norm=True),
        dict(bias_for_layer_norm=True),
        dict(residual_dropout=0.1),
        dict(embedding_size=V - 1),
        dict(block_group_size=2),
        dict(layer_norm_with_affine=False),
    ],
)
def test_unsupported_config_raises(bad):
    with pytest.raises(ValueError):
        tiny_config(**bad)


def test_config_json_has_published_names(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "llada"
    assert data["architectures"] == ["LLaDAModelLM"]
    for key in PUBLISHED_KEYS:
        assert key in data, key
    assert data["d_model"] == 16 and data["n_layers"] == 1 and data["weight_tying"] is False
    for hf_name in ("hidden_size", "num_attention_heads", "num_hidden_layers", "tie_word_embeddings", "auto_map"):
        assert hf_name not in data
    # Round trip of the config alone.
    c2 = LLaDAConfig.from_pretrained(tmp_path)
    assert c2.to_dict() == model.config.to_dict()


def test_save_load_roundtrip_single_and_sharded(tmp_path):
    from transformers import AutoModel, AutoModelForCausalLM

    register_auto_classes()
    register_auto_classes()  # idempotent
    model = tiny_model(seed=21, n_layers=2, n_heads=4, n_kv_heads=2)
    mc.assert_save_load_roundtrip(model, _ids(), tmp_path, [AutoModel, AutoModelForCausalLM], LLaDAConfig)


def test_bf16_save_load_roundtrip(tmp_path):
    from transformers import AutoModel

    register_auto_classes()
    model = tiny_model(seed=22).to(torch.bfloat16)
    mc.assert_bf16_save_load_roundtrip(model, _ids(), tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        legacy = AutoModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    mc.assert_same_weights(model, legacy)
    # fp32 weights loaded as bf16 are the rounded weights.
    fp32_dir = tmp_path / "fp32"
    tiny_model(seed=22).save_pretrained(fp32_dir)
    as_bf16 = AutoModel.from_pretrained(fp32_dir, dtype=torch.bfloat16)
    assert as_bf16.model.transformer.wte.weight.dtype == torch.bfloat16
    mc.assert_same_weights(model, as_bf16)


def test_published_style_checkpoint_loads_without_remote_code(tmp_path):
    """A config.json as published (with auto_map to remote code) resolves to the native class."""
    from transformers import AutoModel

    register_auto_classes()
    model = tiny_model(seed=23)
    cfg = {
        "activation_type": "silu",
        "alibi": False,
        "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0,
        "attention_layer_norm": False,
        "attention_layer_norm_with_affine": True,
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
        "bias_for_layer_norm": False,
        "block_group_size": 1,
        "block_type": "llama",
        "d_model": 16,
        "embedding_dropout": 0.0,
        "embedding_size": V,
        "eos_token_id": V - 2,
        "flash_attention": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "init_cutoff_factor": None,
        "init_device": "meta",
        "init_fn": "mitchell",
        "init_std": 0.02,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "mask_token_id": V - 1,
        "max_sequence_length": 64,
        "mlp_hidden_size": 24,
        "mlp_ratio": 4,
        "model_type": "llada",
        "multi_query_attention": None,
        "n_heads": 2,
        "n_kv_heads": 2,
        "n_layers": 1,
        "pad_token_id": V - 2,
        "precision": "amp_bf16",
        "residual_dropout": 0.0,
        "rms_norm_eps": 1e-05,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": 10000.0,
        "scale_logits": False,
        "torch_dtype": "float32",
        "transformers_version": "4.46.3",
        "use_cache": False,
        "vocab_size": V,
        "weight_tying": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        os.fspath(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is LLaDAModelLM
    mc.assert_same_weights(model, loaded)


def test_gradient_checkpointing_same_gradients():
    model = tiny_model(seed=31, n_layers=2, n_heads=4, n_kv_heads=2)
    ids = _ids(seed=32)
    target = _ids(seed=33)

    def grads():
        model.zero_grad(set_to_none=True)
        logits = model(ids).logits
        F.cross_entropy(logits.reshape(-1, V), target.reshape(-1)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    model.train()
    plain = grads()
    calls = []
    blocks = model.model.transformer.blocks
    originals = [b.attention for b in blocks]
    for b, orig in zip(blocks, originals):
        b.attention = (lambda o: lambda *a, **k: (calls.append(1), o(*a, **k))[1])(orig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()
    assert getattr(model, "is_activation_checkpointing", True)  # (newer transformers only)
    assert all(b.gradient_checkpointing for b in blocks)
    ckpt = grads()
    assert len(calls) == 2 * len(blocks)  # every block was recomputed in backward
    for n in plain:
        torch.testing.assert_close(ckpt[n], plain[n], atol=1e-6, rtol=1e-5)
    # renamed in newer transformers; the old name still works there but warns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    assert not any(b.gradient_checkpointing for b in blocks)


def test_resize_token_embeddings_keeps_config_consistent(tmp_path):
    from transformers import AutoModel

    register_auto_classes()
    model = tiny_model(seed=41)
    model.resize_token_embeddings(40, mean_resizing=False)
    assert model.config.embedding_size == 40 and model.config.vocab_size == 40
    assert model.model.transformer.ff_out.weight.shape == (40, 16)
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    mc.assert_same_weights(model, loaded)
    with torch.no_grad():
        assert loaded(_ids()).logits.shape == (2, 7, 40)
