"""Dream's diffusion_generate sampler (and the core low_confidence sampler) on a tiny Dream."""

from __future__ import annotations

import math

import pytest
import torch

import dare_plugin_dream
from dare_core.config.structure import structure
from dare_core.testing.registries import build_for
from dare_core.workflows.batching import left_pad
from dare_plugin_dream.sampler import (
    DreamSampler,
    DreamSamplerConfig,
    sample_tokens,
    top_k_filter,
    top_p_filter,
    transfer_counts,
)
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

R, STEPS = 8, 4


def _prompts(wrapper):
    texts = ["a", "Solve 1 0 3 0 please", "hello world"]
    return [wrapper.encode(wrapper.render_prompt([{"role": "user", "content": t}])) for t in texts]


def _gen(wrapper, cfg, prompts, seed=0, record=frozenset({"reveal_step"})):
    ids, mask = left_pad(prompts, wrapper.pad_token_id)
    out = DreamSampler(cfg).generate(wrapper, ids, mask, record=record, generator=torch.Generator().manual_seed(seed))
    return ids, mask, out


# --------------------------------------------------------------------------- pieces
def test_schedule_matches_the_reference_example():
    assert transfer_counts(64, 8) == [7, 8, 8, 8, 8, 8, 8, 9]
    assert sum(transfer_counts(8, 4)) == 8 and transfer_counts(3, 5)[-1] >= 1


def test_top_p_and_top_k_filters_by_hand():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    low = torch.finfo(torch.float32).min
    kept = lambda z: (z > low).tolist()[0]  # noqa: E731
    # cumulative (sorted) 0.5, 0.8, 0.95, 1.0: keep up to and including the token crossing top_p
    assert kept(top_p_filter(logits, 0.7)) == [False, True, False, True]
    assert kept(top_p_filter(logits, 0.85)) == [False, True, True, True]
    assert kept(top_p_filter(logits, 0.4)) == [False, True, False, False]
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    assert kept(top_k_filter(logits, 2)) == [False, True, False, True]
    assert torch.equal(top_k_filter(logits, 0), logits)


def test_confidences_by_hand():
    p = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    logits = p.log()
    conf, x0 = sample_tokens(logits, temperature=0.0)
    assert x0.tolist() == [1, 0] and torch.allclose(conf, torch.tensor([0.6, 0.5]))
    conf, _ = sample_tokens(logits, temperature=0.0, confidence="topk_margin")
    assert torch.allclose(conf, torch.tensor([0.3, 0.25]))
    conf, _ = sample_tokens(logits, temperature=0.0, confidence="entropy")
    want = [sum(q * math.log(q + 1e-10) for q in row) for row in p.tolist()]
    assert torch.allclose(conf, torch.tensor(want), atol=1e-6)
    # temperature: draws follow softmax(logits / T); confidence = probability of the draw
    g = torch.Generator().manual_seed(0)
    conf, x0 = sample_tokens(logits.repeat(4000, 1)[:4000], temperature=2.0, generator=g)
    tempered = torch.softmax(logits[0] / 2.0, -1)
    freq = torch.bincount(x0[::2], minlength=3).float() / 2000
    assert (freq - tempered).abs().max() < 0.04
    assert torch.allclose(conf[::2], tempered[x0[::2]])


def test_config_validation():
    for bad in (
        dict(alg="random"),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(steps=0),
        dict(eps=1.0),
        dict(temperature=-1.0),
        dict(top_k=-1),
        dict(alg_temp=-0.1),
    ):
        with pytest.raises(ValueError):
            DreamSamplerConfig(**bad)
    _, problems = structure(DreamSamplerConfig, {"block_length": 8}, "rollout")
    assert problems and "block_length" in problems[0]


# --------------------------------------------------------------------------- replay oracle
def _replay_check(wrapper, ids, mask, out, cfg):
    """Re-run the denoising from the recorded reveal steps with plain wrapper.logits calls and
    check each step's commits: greedy candidates, the quota, and that every committed position is
    at least as confident as every position left masked."""
    b, p = ids.shape
    reveal = out.reveal_step
    assert reveal.shape == (b, R) and bool((reveal >= 0).all()) and bool((reveal < cfg.steps).all())
    x = torch.cat([ids, torch.full((b, R), wrapper.mask_token_id)], 1)
    attn = torch.cat([mask, torch.ones(b, R, dtype=torch.long)], 1)
    quota = transfer_counts(R, cfg.steps, cfg.eps)
    calls = 0
    for step in range(cfg.steps):
        now = reveal == step
        assert now.sum(dim=1).tolist() == [quota[step]] * b
        if quota[step] == 0:
            continue
        calls += 1
        with torch.no_grad():
            logits = wrapper.logits(x, attn)[:, p:].double()
        logits[..., wrapper.mask_token_id] = -math.inf
        probs = torch.softmax(logits, -1)
        best = probs.max(-1)
        if cfg.alg == "maskgit_plus":
            conf = best.values
        elif cfg.alg == "topk_margin":
            top = probs.topk(2, -1).values
            conf = top[..., 0] - top[..., 1]
        else:
            conf = (probs * torch.log(probs + 1e-10)).sum(-1)
        pending = x[:, p:] == wrapper.mask_token_id
        for row in range(b):
            assert torch.equal(out.response_ids[row][now[row]], best.indices[row][now[row]])
            later = pending[row] & ~now[row]
            if bool(later.any()):
                assert float(conf[row][now[row]].min()) >= float(conf[row][later].max()) - 1e-6
        x[:, p:] = torch.where(now, out.response_ids, x[:, p:])
    assert out.nfe == calls
    assert torch.equal(x[:, p:], out.response_ids)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_confidence_algorithms_greedy_replay(wrapper, alg):
    cfg = DreamSamplerConfig(gen_length=R, steps=STEPS, alg=alg, temperature=0.0, top_p=1.0)
    ids, mask, out = _gen(wrapper, cfg, _prompts(wrapper))
    assert not (out.response_ids == wrapper.mask_token_id).any()
    assert out.num_steps == STEPS and out.response_mask.shape == (3, R) and bool(out.response_mask.all())
    _replay_check(wrapper, ids, mask, out, cfg)


@pytest.mark.parametrize("alg", ["origin", "maskgit_plus", "topk_margin", "entropy"])
def test_left_padded_batch_equals_one_prompt_at_a_time(wrapper, alg):
    cfg = DreamSamplerConfig(gen_length=R, steps=STEPS, alg=alg, temperature=0.0, top_p=1.0)
    prompts = _prompts(wrapper)
    _, mask, out = _gen(wrapper, cfg, prompts)
    assert not bool(mask.all())  # really padded
    for i, prompt in enumerate(prompts):
        _, _, alone = _gen(wrapper, cfg, [prompt])
        if alg == "origin":  # random transfer draws differ between batch and single runs
            continue
        assert torch.equal(alone.response_ids[0], out.response_ids[i])
        assert torch.equal(alone.reveal_step[0], out.reveal_step[i])


@pytest.mark.parametrize("alg", ["origin", "maskgit_plus", "topk_margin", "entropy"])
def test_sampled_generation_is_seeded_and_consistent(wrapper, alg):
    cfg = DreamSamplerConfig(
        gen_length=R,
        steps=STEPS,
        alg=alg,
        temperature=1.0,
        top_p=0.9,
        top_k=50,
        alg_temp=0.5 if alg == "entropy" else 0.0,
    )
    prompts = _prompts(wrapper)
    _, _, a = _gen(wrapper, cfg, prompts, seed=3)
    _, _, b = _gen(wrapper, cfg, prompts, seed=3)
    _, _, c = _gen(wrapper, cfg, prompts, seed=4)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.reveal_step, b.reveal_step)
    assert not torch.equal(a.response_ids, c.response_ids)
    assert not (a.response_ids == wrapper.mask_token_id).any()
    assert bool((a.reveal_step >= 0).all()) and bool((a.reveal_step < STEPS).all())
    if alg != "origin":
        counts = [[int((a.reveal_step[r] == s).sum()) for s in range(STEPS)] for r in range(3)]
        assert counts == [transfer_counts(R, STEPS)] * 3
    else:
        assert a.nfe <= STEPS


def test_origin_reveals_about_one_minus_s_over_t_per_step(wrapper):
    cfg = DreamSamplerConfig(gen_length=64, steps=4, alg="origin", temperature=0.0, top_p=1.0)
    prompts = _prompts(wrapper)[:1] * 8
    _, _, out = _gen(wrapper, cfg, prompts)
    ts = torch.linspace(1, cfg.eps, 5)
    left = 64 * 8
    for step in range(4):
        got = int((out.reveal_step == step).sum())
        p = 1.0 if step == 3 else float(1 - ts[step + 1] / ts[step])
        expect = left * p
        assert abs(got - expect) <= 4 * math.sqrt(max(left * p * (1 - p), 1.0)) + 1, (step, got, expect)
        left -= got
    assert left == 0


def test_truncate_at_eos_and_records(wrapper):
    cfg = DreamSamplerConfig(gen_length=R, steps=STEPS, temperature=0.0, truncate_at_eos=True)
    ids, mask, out = _gen(wrapper, cfg, _prompts(wrapper), record=frozenset())
    assert out.reveal_step is None
    for row in range(3):
        eos = (out.response_ids[row] == wrapper.eos_token_id).nonzero()
        n = int(eos[0]) + 1 if len(eos) else R
        assert out.response_mask[row].tolist() == [1] * n + [0] * (R - n)
    with pytest.raises(ValueError):
        DreamSampler(cfg).generate(wrapper, ids, mask, record=frozenset({"states"}))


def test_registered_as_the_family_default(wrapper):
    dare = build_for(dare_plugin_dream)
    family = dare.registries.models.get("dream")
    assert family.default_rollout == "dream_generate"
    spec = dare.registries.rollouts.get("dream_generate")
    assert spec.records == frozenset({"reveal_step"}) and "masked" in spec.kinds
    assert "low_confidence" in family.rollouts


def test_core_low_confidence_sampler_works_on_dream(wrapper):
    """The generic sampler only calls wrapper.logits (aligned): greedy, one token per step,
    each committed token is the argmax of the aligned logits at that state."""
    cfg = LowConfidenceConfig(gen_length=R, block_length=R, steps=R, temperature=0.0)
    prompts = _prompts(wrapper)
    ids, mask = left_pad(prompts, wrapper.pad_token_id)
    out = LowConfidenceSampler(cfg).generate(wrapper, ids, mask, record=frozenset({"reveal_step"}))
    assert not (out.response_ids == wrapper.mask_token_id).any()
    b, p = ids.shape
    x = torch.cat([ids, torch.full((b, R), wrapper.mask_token_id)], 1)
    attn = torch.cat([mask, torch.ones(b, R, dtype=torch.long)], 1)
    for step in range(R):
        now = out.reveal_step == step
        assert now.sum(1).tolist() == [1] * b
        with torch.no_grad():
            logits = wrapper.logits(x, attn)[:, p:]
        logits[..., wrapper.mask_token_id] = -math.inf
        assert torch.equal(out.response_ids[now], logits.argmax(-1)[now])
        x[:, p:] = torch.where(now, out.response_ids, x[:, p:])
    single = LowConfidenceSampler(cfg).generate(wrapper, *left_pad(prompts[1:2], wrapper.pad_token_id))
    assert torch.equal(single.response_ids[0], out.response_ids[1])


def test_core_cached_backend_drives_dream_through_forward_cached(wrapper):
    """The core's KV-cache backend uses only wrapper.forward_cached and logit_shift: without a
    cache it reproduces the reference sampler; with prefix / dual caches it runs and fills every
    position (the caches are approximate for a bidirectional model, so outputs may differ)."""
    from dare_plugin_samplers.fast import FastConfig, FastSampler

    ids, mask = left_pad(_prompts(wrapper), wrapper.pad_token_id)
    rec = frozenset({"reveal_step"})
    ref = LowConfidenceSampler(LowConfidenceConfig(gen_length=R, block_length=4, steps=R, temperature=0.0)).generate(
        wrapper, ids, mask, record=rec
    )
    for cache in ("none", "prefix", "dual"):
        cfg = FastConfig(gen_length=R, block_length=4, steps=R, cache=cache, decoding="quota", temperature=0.0)
        out = FastSampler(cfg).generate(wrapper, ids, mask, record=rec)
        assert not (out.response_ids == wrapper.mask_token_id).any()
        if cache == "none":
            assert torch.equal(out.response_ids, ref.response_ids)
        # step 0 is a full forward in every mode: same position and token as the reference
        first, first_ref = out.reveal_step == 0, ref.reveal_step == 0
        assert torch.equal(first, first_ref) and torch.equal(out.response_ids[first], ref.response_ids[first_ref])
