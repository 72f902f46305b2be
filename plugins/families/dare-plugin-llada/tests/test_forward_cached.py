"""LLaDA's KV cache (DARE's cache contract) and the core ``fast`` rollout driving it.

Oracle: the cache-free forward. A cache taken from a full forward of the same sequence must give
the full forward's logits for the remaining positions (every layer's keys of the cached
positions are then exact), in any slot order, with padding masked by 2-D or 4-D masks.
"""

from __future__ import annotations

import math

import pytest
import torch

from dare_plugin_llada.configuration_llada import LLaDAConfig
from dare_plugin_llada.modeling_llada import LLaDAModelLM, apply_rotary, rotary_cos_sin
from dare_plugin_llada.wrapper import CAPABILITIES, LLaDAWrapper
from dare_plugin_samplers.fast import FastConfig, FastSampler
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

V = 40
MASK, EOS, PAD = V - 1, V - 2, V - 3
ATOL = 2e-5


def model(seed=0, **overrides):
    kw = dict(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        mlp_hidden_size=48,
        vocab_size=V,
        embedding_size=V,
        max_sequence_length=128,
        rope_theta=10000.0,
        mask_token_id=MASK,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=V - 4,
    )
    kw.update(overrides)
    torch.manual_seed(seed)
    m = LLaDAModelLM(LLaDAConfig(**kw))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight") and not name.endswith("ln_f.weight"):
                p.copy_(2.0 * torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return m.eval()


def wrapper(m):
    return LLaDAWrapper(
        family="llada",
        module=m,
        tokenizer=None,
        kind="masked",
        mask_token_id=MASK,
        eos_token_id=EOS,
        pad_token_id=PAD,
        capabilities=CAPABILITIES,
    )


def ids(b=3, length=18, seed=0):
    return torch.randint(0, V - 4, (b, length), generator=torch.Generator().manual_seed(seed))


def take(kv, cols):
    return [(k[:, :, cols], v[:, :, cols]) for k, v in kv]


def test_kv_cache_capability_declared():
    assert "kv_cache" in CAPABILITIES


def test_present_has_kv_heads_and_layer0_keys_are_rotated_per_position():
    m = model()
    x = ids()
    pos = torch.arange(18).expand_as(x)
    with torch.no_grad():
        out = m(x, position_ids=pos, use_cache=True)
        present = out.cache if hasattr(out, "cache") else out.past_key_values
    assert len(present) == 2
    k0, v0 = present[0]
    assert k0.shape == v0.shape == (3, 2, 18, 8)  # [B, n_kv_heads, P, head_dim]
    # layer 0 keys depend on the token and its position only: recompute one by hand
    blk = m.model.transformer["blocks"][0]
    with torch.no_grad():
        h = blk.attn_norm(m.model.transformer["wte"](x[:, 5:6]))
        k = blk.k_proj(h).view(3, 1, 2, 8).transpose(1, 2)
        cos, sin = rotary_cos_sin(pos[:, 5:6], 8, 10000.0)
        k = apply_rotary(k, cos, sin, True)
    assert torch.allclose(k0[:, :, 5:6], k, atol=1e-6)


@pytest.mark.parametrize("shuffle", [False, True])
def test_dual_cache_block_equals_full_forward(shuffle):
    m = model()
    w = wrapper(m)
    x = ids()
    pos = torch.arange(18).expand_as(x)
    lo, hi = 7, 11
    cached = torch.cat([torch.arange(lo), torch.arange(hi, 18)])
    if shuffle:
        cached = cached[torch.randperm(len(cached), generator=torch.Generator().manual_seed(1))]
    with torch.no_grad():
        full, present = w.forward_cached(x, position_ids=pos, use_cache=True)
        assert torch.equal(full, w.logits(x))
        blk, new = w.forward_cached(
            x[:, lo:hi], position_ids=pos[:, lo:hi], past_key_values=take(present, cached), use_cache=True
        )
    assert torch.allclose(blk, full[:, lo:hi], atol=ATOL)
    assert all(k.shape[2] == 18 for k, _ in new)


def test_prefix_cache_and_padding_masks():
    m = model(seed=3)
    w = wrapper(m)
    x = ids(seed=2)
    valid = torch.ones_like(x)
    valid[0, :4] = 0
    valid[1, :1] = 0
    x[valid == 0] = PAD
    pos = torch.arange(18).expand_as(x)
    with torch.no_grad():
        full, present = w.forward_cached(x, position_ids=pos, attention_mask=valid, use_cache=True)
        assert torch.equal(full, w.logits(x, valid))
        tail, _ = w.forward_cached(
            x[:, 9:],
            position_ids=pos[:, 9:],
            past_key_values=take(present, torch.arange(9)),
            attention_mask=valid,
            use_cache=False,
        )
        four_d = valid.bool()[:, None, None, :].expand(3, 1, 9, 18)
        tail4, _ = w.forward_cached(
            x[:, 9:],
            position_ids=pos[:, 9:],
            past_key_values=take(present, torch.arange(9)),
            attention_mask=four_d,
            use_cache=False,
        )
        leaky, _ = w.forward_cached(
            x[:, 9:], position_ids=pos[:, 9:], past_key_values=take(present, torch.arange(9)), use_cache=False
        )
    assert torch.allclose(tail, full[:, 9:], atol=ATOL)
    assert torch.allclose(tail4, full[:, 9:], atol=ATOL)
    assert not torch.allclose(leaky[0], full[0, 9:], atol=ATOL)


def test_bad_caches_and_masks_are_value_errors():
    m = model()
    x = ids()
    with torch.no_grad():
        out = m(x, use_cache=True)
    present = out.cache if hasattr(out, "cache") else out.past_key_values
    with pytest.raises(ValueError, match="one per layer"):
        m(x[:, :2], past_key_values=present[:1])
    with pytest.raises(ValueError, match="n_kv_heads"):
        m(x[:, :2], past_key_values=[(k[:, :1], v[:, :1]) for k, v in present])
    with pytest.raises(ValueError, match="2D attention_mask"):
        m(x[:, :2], past_key_values=present, attention_mask=torch.ones(3, 2))


def test_tuple_output_carries_the_cache():
    m = model()
    x = ids()
    with torch.no_grad():
        logits, present = m(x, use_cache=True, return_dict=False)
    assert logits.shape == (3, 18, V) and len(present) == 2


def _prompts(b=3, p=6):
    pid = ids(b, p, seed=4)
    pm = torch.ones_like(pid)
    pm[0, :3] = 0
    pm[2, :1] = 0
    pid[pm == 0] = PAD
    return pid, pm


def test_fast_rollout_without_cache_equals_reference_sampler():
    w = wrapper(model(seed=5))
    pid, pm = _prompts()
    rec = frozenset({"reveal_step"})
    ref = LowConfidenceSampler(LowConfidenceConfig(gen_length=16, block_length=4, steps=16, temperature=0.0)).generate(
        w, pid, pm, record=rec
    )
    out = FastSampler(
        FastConfig(gen_length=16, block_length=4, steps=16, temperature=0.0, cache="none", decoding="quota")
    ).generate(w, pid, pm, record=rec)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)


@pytest.mark.parametrize("cache", ["prefix", "dual", "delayed"])
def test_fast_rollout_block_start_steps_equal_no_cache(cache):
    """One step per block: every forward is a block-start full forward (the uncached result)."""
    w = wrapper(model(seed=5))
    pid, pm = _prompts()
    kw = dict(gen_length=16, block_length=4, steps=4, temperature=0.0, decoding="quota")
    ref = FastSampler(FastConfig(cache="none", **kw)).generate(w, pid, pm)
    out = FastSampler(FastConfig(cache=cache, **kw)).generate(w, pid, pm)
    assert torch.equal(out.response_ids, ref.response_ids)


def test_fast_rollout_cached_steps_stay_close_to_exact():
    """Later steps reuse block-start keys (an approximation); on this small random model most
    tokens still agree with the exact sampler."""
    w = wrapper(model(seed=5))
    pid, pm = _prompts()
    kw = dict(gen_length=16, block_length=4, steps=16, temperature=0.0, decoding="quota")
    ref = FastSampler(FastConfig(cache="none", **kw)).generate(w, pid, pm)
    out = FastSampler(FastConfig(cache="dual", **kw)).generate(w, pid, pm)
    assert (out.response_ids == ref.response_ids).float().mean() >= 0.5


@pytest.mark.parametrize("decoding", ["quota", "threshold"])
def test_delayed_cache_is_exact_on_a_one_layer_llada(decoding):
    """With one layer a position's keys/values depend on its own token and position only, so the
    delayed cache (every position cached, masked and just-committed block positions re-queried,
    stale entries masked out, new ones written by position) must reproduce the uncached sampler,
    with left padding and grouped-query heads."""
    w = wrapper(model(seed=5, n_layers=1))
    pid, pm = _prompts()
    rec = frozenset({"reveal_step"})
    kw = dict(gen_length=16, block_length=8, steps=16, temperature=0.0, decoding=decoding, threshold=0.2)
    ref = FastSampler(FastConfig(cache="none", **kw)).generate(w, pid, pm, record=rec)
    out = FastSampler(FastConfig(cache="delayed", **kw)).generate(w, pid, pm, record=rec)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)
