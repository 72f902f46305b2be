"""The ``fast`` rollout backend: equivalences with the reference sampler, cache use, padding,
the reveal schedule, threshold decoding, stop handling and config errors (toy model, CPU)."""

from __future__ import annotations

import pytest
import torch

import dare_plugin_samplers
from dare_core.testing.registries import build_for
from dare_core.testing.toy import ToyWrapper, make_toy_wrapper
from dare_plugin_samplers.fast import FastConfig, FastSampler
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

REVEAL = frozenset({"reveal_step"})


def toy(seed=0, sharp=1.0):
    """Toy wrapper; ``sharp`` scales the LM head so some predictions are confident."""
    w = make_toy_wrapper(seed=seed)
    with torch.no_grad():
        w.module.head.weight.mul_(sharp)
        w.module.head.bias.mul_(sharp)
    return w


class Spy:
    """Wraps a wrapper and records every ``forward_cached`` call."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = []

    def forward_cached(self, input_ids, **kw):
        past = kw.get("past_key_values")
        self.calls.append(
            {
                "q": input_ids.shape[1],
                "past": None if past is None else past[0][0].shape[2],
                "mask": kw.get("attention_mask"),
                "use_cache": kw.get("use_cache"),
            }
        )
        return self._inner.forward_cached(input_ids, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def prompts(w, b=3, p=7, seed=0, pads=(3, 0, 1)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 60, (b, p), generator=g)
    mask = torch.ones(b, p, dtype=torch.long)
    for row, n in enumerate(pads[:b]):
        ids[row, :n] = w.pad_token_id
        mask[row, :n] = 0
    return ids, mask


def fast(**kw):
    return FastSampler(FastConfig(**{"temperature": 0.0, **kw}))


def reference(**kw):
    return LowConfidenceSampler(LowConfidenceConfig(**{"temperature": 0.0, **kw}))


# --------------------------------------------------------------------------- equivalences
@pytest.mark.parametrize("gen,block,steps", [(16, 4, 16), (16, 8, 8), (12, 12, 6), (16, 4, 8)])
def test_no_cache_quota_equals_reference_sampler(gen, block, steps):
    """cache=none, decoding=quota: exactly the reference sampler (tokens, reveal steps, nfe)."""
    w = toy()
    pid, pm = prompts(w)
    ref = reference(gen_length=gen, block_length=block, steps=steps).generate(w, pid, pm, record=REVEAL)
    out = fast(gen_length=gen, block_length=block, steps=steps, cache="none", decoding="quota").generate(
        w, pid, pm, record=REVEAL
    )
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)
    assert out.nfe == ref.nfe and out.num_steps == ref.num_steps == steps


def test_no_cache_sampled_equals_reference_with_the_same_stream():
    w = toy()
    pid, pm = prompts(w)
    kw = dict(gen_length=16, block_length=4, steps=16, temperature=0.8)
    ref = reference(**kw).generate(w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(5))
    out = fast(cache="none", decoding="quota", **kw).generate(
        w, pid, pm, record=REVEAL, generator=torch.Generator().manual_seed(5)
    )
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)


def test_threshold_one_without_cache_is_one_token_per_step():
    """threshold 1.0 commits only the forced most confident token: the one-per-step reference."""
    w = toy()
    pid, pm = prompts(w)
    ref = reference(gen_length=16, block_length=4, steps=16).generate(w, pid, pm, record=REVEAL)
    out = fast(gen_length=16, block_length=4, cache="none", decoding="threshold", threshold=1.0).generate(
        w, pid, pm, record=REVEAL
    )
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)
    assert out.nfe == 16 and out.num_steps == 16


@pytest.mark.parametrize("cache", ["prefix", "dual", "delayed"])
def test_first_step_of_each_block_equals_no_cache(cache):
    """One step per block: only block-start (full) forwards run, so the caches change nothing."""
    w = toy(sharp=3.0)
    pid, pm = prompts(w)
    kw = dict(gen_length=16, block_length=4, steps=4, decoding="quota")
    ref = fast(cache="none", **kw).generate(w, pid, pm, record=REVEAL)
    spy = Spy(w)
    out = fast(cache=cache, **kw).generate(spy, pid, pm, record=REVEAL)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)
    assert all(c["past"] is None and c["q"] == 7 + 16 for c in spy.calls)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_block_start_logits_equal_no_cache_logits(cache):
    """Block-start steps see exactly the uncached logits, later ones the cached forward."""
    w = toy()
    pid, pm = prompts(w)
    seen = {}

    class Capture(Spy):
        def forward_cached(self, input_ids, **kw):
            logits, present = super().forward_cached(input_ids, **kw)
            seen.setdefault(self.tag, []).append((kw.get("past_key_values") is None, logits.clone()))
            return logits, present

    ref_spy, spy = Capture(w), Capture(w)
    ref_spy.tag, spy.tag = "none", cache
    kw = dict(gen_length=8, block_length=4, steps=8, decoding="quota")
    ref = fast(cache="none", **kw).generate(ref_spy, pid, pm)
    out = fast(cache=cache, **kw).generate(spy, pid, pm)
    # step 0 of block 0: identical input, identical logits
    assert torch.equal(seen[cache][0][1], seen["none"][0][1])
    # every block starts with a full (cache-free) forward: steps 0 and 4 of 8
    assert [full for full, _ in seen[cache]] == [True, False, False, False] * 2
    assert out.response_ids.shape == ref.response_ids.shape


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_one_layer_model_makes_the_caches_exact(cache):
    """The toy has one attention layer, so a position's keys/values depend on its own token and
    position only: a cache from the block start stays exact while only the block changes. Every
    cached step must then see the uncached logits (this checks positions, slices and masks)."""
    w = toy(sharp=2.0)
    pid, pm = prompts(w)
    logs = {}

    class Capture(Spy):
        def forward_cached(self, input_ids, **kw):
            logits, present = super().forward_cached(input_ids, **kw)
            logs.setdefault(self.tag, []).append(logits[:, -16:] if kw.get("past_key_values") is None else logits)
            return logits, present

    kw = dict(gen_length=16, block_length=4, steps=16, decoding="quota")
    ref_spy, spy = Capture(w), Capture(w)
    ref_spy.tag, spy.tag = "none", cache
    ref = fast(cache="none", **kw).generate(ref_spy, pid, pm, record=REVEAL)
    out = fast(cache=cache, **kw).generate(spy, pid, pm, record=REVEAL)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)
    for step, (a, b) in enumerate(zip(logs[cache], logs["none"])):
        blk = step // 4
        want = b[:, blk * 4 : blk * 4 + 4]
        got = a[:, :4] if a.shape[1] != 16 else a[:, blk * 4 : blk * 4 + 4]
        assert torch.allclose(got, want, atol=1e-5), step


@pytest.mark.parametrize("decoding", ["quota", "threshold"])
def test_one_layer_model_makes_the_delayed_cache_exact(decoding):
    """On the one-layer toy a position's keys/values depend on its token and position only, so
    the delayed cache (committed block tokens re-encoded once, then reused) is exact: same tokens,
    reveal steps and forward count as the uncached sampler, also with left padding and with
    threshold decoding (rows then need different query counts)."""
    w = toy(sharp=2.0)
    pid, pm = prompts(w, pads=(3, 0, 1))
    kw = dict(gen_length=16, block_length=8, steps=16, decoding=decoding, threshold=0.3)
    ref = fast(cache="none", **kw).generate(w, pid, pm, record=REVEAL)
    out = fast(cache="delayed", **kw).generate(w, pid, pm, record=REVEAL)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.reveal_step, ref.reveal_step)
    assert out.nfe == ref.nfe


def test_delayed_cache_queries_masked_and_just_committed_positions():
    """One token per step in blocks of 4: block-start full forward, then queries of 3 masked +
    1 just committed, 2 + 1, 1 + 1 positions; the cache always holds every position and the
    mask drops exactly the queried positions' stale entries."""
    w = toy()
    pid, pm = prompts(w, pads=(0, 0, 0))
    p, gen, block = 7, 16, 4
    spy = Spy(w)
    out = fast(gen_length=gen, block_length=block, steps=gen, cache="delayed", decoding="quota").generate(spy, pid, pm)
    assert out.nfe == len(spy.calls) == gen
    for blk in range(gen // block):
        calls = spy.calls[blk * block : (blk + 1) * block]
        assert calls[0]["past"] is None and calls[0]["q"] == p + gen
        assert [c["q"] for c in calls[1:]] == [4, 3, 2]
        for c in calls[1:]:
            assert c["past"] == p + gen and c["use_cache"] is True
            mask = c["mask"]
            assert mask.shape == (3, p + gen + c["q"])
            assert (mask[:, : p + gen] == 0).sum(dim=1).tolist() == [c["q"]] * 3
            assert bool((mask[:, p + gen :] == 1).all())


def test_delayed_cache_refuses_shifted_logits():
    w = shifted_toy()
    pid, pm = prompts(w)
    with pytest.raises(ValueError, match="logit_shift = 1.*rollout.cache=dual"):
        fast(gen_length=8, block_length=4, steps=8, cache="delayed").generate(w, pid, pm)


# --------------------------------------------------------------------------- cache use
def test_dual_and_prefix_query_lengths_and_nfe():
    w = toy()
    pid, pm = prompts(w, pads=(0, 0, 0))
    p, gen, block = 7, 16, 4
    for cache, q_of in (("dual", lambda lo: block), ("prefix", lambda lo: p + gen - lo)):
        spy = Spy(w)
        out = fast(gen_length=gen, block_length=block, steps=gen, cache=cache, decoding="quota").generate(spy, pid, pm)
        assert out.nfe == len(spy.calls) == gen
        for blk in range(gen // block):
            calls = spy.calls[blk * block : (blk + 1) * block]
            assert calls[0]["past"] is None and calls[0]["q"] == p + gen and calls[0]["use_cache"]
            lo = p + blk * block
            for c in calls[1:]:
                assert c["q"] == q_of(lo) and c["past"] == p + gen - c["q"]
                assert c["use_cache"] is False and c["mask"] is None  # nothing padded


def test_shifted_family_queries_start_one_before_the_block():
    w = shifted_toy()
    pid, pm = prompts(w)
    ref = reference(gen_length=12, block_length=4, steps=12).generate(w, pid, pm, record=REVEAL)
    out = fast(gen_length=12, block_length=4, steps=12, cache="none", decoding="quota").generate(
        w, pid, pm, record=REVEAL
    )
    assert torch.equal(out.response_ids, ref.response_ids)
    spy = Spy(w)
    dual = fast(gen_length=12, block_length=4, steps=3, cache="dual", decoding="quota").generate(spy, pid, pm)
    assert torch.equal(
        dual.response_ids,
        fast(gen_length=12, block_length=4, steps=3, cache="none", decoding="quota").generate(w, pid, pm).response_ids,
    )
    spy = Spy(w)
    fast(gen_length=12, block_length=4, steps=12, cache="dual", decoding="quota").generate(spy, pid, pm)
    cached = [c for c in spy.calls if c["past"] is not None]
    assert cached and all(c["q"] == 5 and c["past"] == 7 + 12 - 5 for c in cached)


class ShiftedToy(ToyWrapper):
    logit_shift = 1

    def align(self, logits):
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def shifted_toy():
    """The toy's module behind a wrapper whose logits are shifted by one (like Dream's)."""
    base = toy()
    return ShiftedToy(
        family="toy",
        module=base.module,
        tokenizer=base.tokenizer,
        kind="masked",
        mask_token_id=base.mask_token_id,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id,
        capabilities=base.capabilities,
    )


def test_refresh_every_reruns_the_full_forward():
    w = toy()
    pid, pm = prompts(w)
    spy = Spy(w)
    out = fast(gen_length=16, block_length=8, steps=16, cache="dual", decoding="quota", refresh_every=3).generate(
        spy, pid, pm
    )
    full = [c["past"] is None for c in spy.calls]
    assert full == [True, False, False] * 2 + [True, False] + [True, False, False] * 2 + [True, False]
    assert out.nfe == 16
    spy = Spy(w)
    fast(gen_length=16, block_length=8, steps=16, cache="dual", decoding="quota", refresh_every=1).generate(
        spy, pid, pm
    )
    assert all(c["past"] is None for c in spy.calls)


# --------------------------------------------------------------------------- padding
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "delayed"])
@pytest.mark.parametrize("decoding", ["quota", "threshold"])
def test_left_padding_is_never_attended(cache, decoding):
    """Batch > 1 with left padding: the pad ids' values cannot matter, rows are independent."""
    w = toy(sharp=3.0)
    pid, pm = prompts(w, b=3, pads=(3, 0, 5))
    sampler = fast(gen_length=16, block_length=4, steps=16, cache=cache, decoding=decoding, threshold=0.5)
    out = sampler.generate(w, pid, pm, record=REVEAL)
    noisy = pid.clone()
    noisy[pm == 0] = torch.randint(4, 60, (int((pm == 0).sum()),), generator=torch.Generator().manual_seed(9))
    out2 = sampler.generate(w, noisy, pm, record=REVEAL)
    assert torch.equal(out.response_ids, out2.response_ids)
    if decoding == "quota":  # threshold steps are shared by the batch, reveal indices too
        for row in range(3):
            alone = sampler.generate(w, pid[row : row + 1], pm[row : row + 1], record=REVEAL)
            assert torch.equal(alone.response_ids[0], out.response_ids[row])
            assert torch.equal(alone.reveal_step[0], out.reveal_step[row])


def test_padding_mask_lists_cached_positions_first():
    w = toy()
    pid, pm = prompts(w, b=2, pads=(2, 0))
    spy = Spy(w)
    fast(gen_length=8, block_length=4, steps=8, cache="dual", decoding="quota").generate(spy, pid, pm)
    cached = [c for c in spy.calls if c["past"] is not None]
    # dual cache for block 1 (columns 11..14 of 15): cache = [0, 11) + [15, 15), then the block
    mask = cached[-1]["mask"]
    assert mask.shape == (2, 15)
    assert mask[0].tolist() == [0, 0] + [1] * 13 and mask[1].tolist() == [1] * 15


# --------------------------------------------------------------------------- threshold decoding
def test_threshold_reveal_schedule_and_progress():
    w = toy(sharp=6.0)
    pid, pm = prompts(w)
    out = fast(gen_length=16, block_length=4, cache="dual", decoding="threshold", threshold=0.6).generate(
        w, pid, pm, record=REVEAL
    )
    r = out.reveal_step
    assert (r >= 0).all() and (r < out.num_steps).all()
    assert out.nfe == out.num_steps <= 16
    # blocks are denoised left to right: every step of block b precedes every step of block b+1
    for row in range(3):
        blocks = r[row].view(4, 4)
        assert (blocks[:-1].amax(dim=1) < blocks[1:].amin(dim=1)).all()
    # every executed step commits at least one token in some row
    assert set(r.flatten().tolist()) == set(range(out.num_steps))


def test_tiny_threshold_commits_a_whole_block_per_step():
    w = toy()
    pid, pm = prompts(w)
    out = fast(gen_length=16, block_length=4, cache="dual", decoding="threshold", threshold=1e-9).generate(
        w, pid, pm, record=REVEAL
    )
    assert out.nfe == 4 and out.num_steps == 4
    assert torch.equal(out.reveal_step, torch.arange(4).repeat_interleave(4).expand(3, 16))


def test_threshold_parallel_decoding_saves_forwards_on_a_confident_model():
    w = toy(sharp=20.0)
    pid, pm = prompts(w)
    out = fast(gen_length=16, block_length=8, cache="dual", decoding="threshold", threshold=0.9).generate(w, pid, pm)
    assert out.nfe < 16


# --------------------------------------------------------------------------- stop handling
def test_suppress_eos_and_truncate_at_eos():
    w = toy(seed=2)
    pid, pm = prompts(w)
    eos = w.eos_token_id
    with torch.no_grad():
        w.module.head.bias[eos] += 50.0  # EOS is everybody's favourite
    plain = fast(gen_length=8, block_length=4, steps=8, cache="dual", decoding="quota", truncate_at_eos=True).generate(
        w, pid, pm
    )
    assert (plain.response_ids == eos).all()
    assert plain.response_mask.tolist() == [[1] + [0] * 7] * 3
    never = fast(gen_length=8, block_length=4, steps=8, cache="dual", decoding="quota", suppress_eos=True).generate(
        w, pid, pm
    )
    assert not (never.response_ids == eos).any()
    assert never.response_mask.sum() == 24


def test_stop_confidence_never_ranks_stop_tokens_last():
    w = toy(seed=2)
    pid, pm = prompts(w)
    with torch.no_grad():
        w.module.head.bias[w.eos_token_id] += 50.0
    out = fast(
        gen_length=8, block_length=8, cache="dual", decoding="threshold", threshold=0.5, stop_confidence="never"
    ).generate(w, pid, pm, record=REVEAL)
    # EOS candidates are never >= threshold at -inf: one forced commit per step
    assert out.nfe == 8


# --------------------------------------------------------------------------- config, capability
@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(gen_length=10, block_length=4), "multiple of rollout.block_length"),
        (dict(gen_length=16, block_length=4, steps=6, decoding="quota"), "multiple of the number of blocks"),
        (dict(decoding="threshold", remasking="random"), "remasking"),
    ],
)
def test_config_errors_name_the_fix(kw, needle):
    with pytest.raises(ValueError, match=needle):
        FastConfig(**kw)


def test_threshold_range_and_choices_are_validated():
    for bad in (dict(threshold=0.0), dict(threshold=1.5), dict(cache="full"), dict(decoding="x")):
        with pytest.raises(ValueError):
            FastConfig(**bad)
    FastConfig(decoding="threshold", steps=7)  # steps only matter to quota decoding


def test_needs_kv_cache_capability_and_masked_kind():
    w = toy()
    pid, pm = prompts(w)
    w.capabilities = frozenset({"bidirectional"})
    with pytest.raises(ValueError, match="kv_cache"):
        fast(gen_length=8, block_length=4).generate(w, pid, pm)
    w = toy()
    w.kind = "block"
    with pytest.raises(ValueError, match="masked"):
        fast(gen_length=8, block_length=4).generate(w, pid, pm)
    with pytest.raises(ValueError, match="cannot record"):
        fast(gen_length=8, block_length=4).generate(toy(), pid, pm, record=frozenset({"states"}))


def test_registered_by_the_samplers_plugin():
    regs = build_for(dare_plugin_samplers).registries
    spec = regs.rollouts.get("fast")
    assert spec.requires == frozenset({"kv_cache", "mask_token"}) and spec.kinds == frozenset({"masked"})
    assert spec.records == frozenset({"reveal_step"}) and spec.config_cls is FastConfig
    assert regs.rollouts.owner("fast") == "dare_plugin_samplers"
    assert isinstance(spec.build(FastConfig()), FastSampler)


def test_micro_batches_give_the_same_greedy_tokens_and_restore_training_mode():
    w = toy()
    w.module.train()
    pid, pm = prompts(w)
    whole = fast(gen_length=8, block_length=4, steps=8, cache="dual", decoding="quota").generate(w, pid, pm)
    parts = fast(gen_length=8, block_length=4, steps=8, cache="dual", decoding="quota", micro_batch_size=2).generate(
        w, pid, pm
    )
    assert torch.equal(whole.response_ids, parts.response_ids)
    assert parts.nfe == 2 * whole.nfe
    assert w.module.training
