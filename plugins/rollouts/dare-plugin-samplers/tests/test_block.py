"""The generic ``block`` rollout backend on the family-free block toy.

The oracle below is an independent, unbatched, uncached transcription of the published
block-diffusion loop (one row, plain Python selection), used to check the batched cached backend.
"""

from __future__ import annotations

import math

import pytest
import torch

import dare_plugin_samplers
from dare_core.config.structure import structure
from dare_core.errors import CapabilityError
from dare_core.testing import make_toy_wrapper
from dare_nn.testing.toy_block import make_toy_block_wrapper
from dare_plugin_samplers.block import BlockRolloutConfig, BlockSampler, block_schedule


@pytest.fixture(scope="module")
def w():
    return make_toy_block_wrapper(seed=3)


PROMPTS = [[10, 11, 12, 13, 14, 15, 16], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41]]


def _pad(prompts, pad):
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@torch.no_grad()
def _oracle(w, prompt, R, steps, strategy, thr=0.85, stop=False):
    bs, mask_id = w.block_size, w.mask_token_id
    n = len(prompt)
    nb = -(-(n + R) // bs)
    x = torch.tensor([prompt + [mask_id] * (nb * bs - n)])
    sched = [bs // steps + (1 if i < bs % steps else 0) for i in range(steps)]
    for blk in range(n // bs, nb):
        lo, hi = blk * bs, (blk + 1) * bs
        for s in range(steps):
            masked = [j for j in range(lo, hi) if int(x[0, j]) == mask_id]
            if not masked:
                break
            logits = w.logits(x[:, :hi])[0, lo:hi].float()
            logits[:, mask_id] = -math.inf
            probs = torch.softmax(logits, -1)
            x0 = probs.argmax(-1)
            conf = {j: float(probs[j - lo, x0[j - lo]]) for j in masked}
            k = sched[s]
            if strategy == "sequential":
                pick = masked[:k]
            else:
                ranked = sorted(masked, key=lambda j: -conf[j])
                pick = ranked[:k]
                if strategy == "low_confidence_dynamic":
                    high = [j for j in masked if conf[j] > thr]
                    if len(high) >= k:
                        pick = high
            for j in pick:
                x[0, j] = x0[j - lo]
        if stop and any(int(t) in w.stop_token_ids for t in x[0, n:hi].tolist()):
            x[0, hi:] = w.eos_token_id
            break
    return x[0, n : n + R].tolist()


def _gen(w, prompts=PROMPTS, **kw):
    cfg = BlockRolloutConfig(**{"gen_length": 10, "steps": 4, "temperature": 0.0, "stop_at_stop_token": False, **kw})
    ids, mask = _pad(prompts, w.pad_token_id)
    return BlockSampler(cfg).generate(
        w, ids, mask, record=frozenset({"reveal_step"}), generator=torch.Generator().manual_seed(0)
    )


def test_schedule():
    assert block_schedule(4, 4) == [1, 1, 1, 1]
    assert block_schedule(4, 3) == [2, 1, 1]
    assert block_schedule(4, 6) == [1, 1, 1, 1, 0, 0]
    assert block_schedule(32, 5) == [7, 7, 6, 6, 6]


@pytest.mark.parametrize("strategy", ["sequential", "low_confidence_static", "low_confidence_dynamic"])
@pytest.mark.parametrize("steps", [4, 2])
def test_batched_cached_equals_unbatched_oracle(w, strategy, steps):
    out = _gen(w, remasking=strategy, steps=steps, confidence_threshold=0.05)
    for b, p in enumerate(PROMPTS):
        want = _oracle(w, p, 10, steps, strategy, thr=0.05)
        assert out.response_ids[b].tolist() == want, (b, strategy)


@pytest.mark.parametrize(
    "strategy", ["sequential", "low_confidence_static", "low_confidence_dynamic", "entropy_bounded"]
)
def test_cache_equals_no_cache_greedy(w, strategy):
    a = _gen(w, remasking=strategy, use_cache=True, gen_length=16)
    b = _gen(w, remasking=strategy, use_cache=False, gen_length=16)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.reveal_step, b.reveal_step)
    assert a.nfe != b.nfe  # the cached run also prefills and commits


def test_nfe_and_reveal_steps(w):
    # one row, 8 prompt tokens (2 full blocks), 8 new tokens, 4 steps: prefill + 4 + commit + 4
    out = _gen(w, prompts=[list(range(10, 18))], gen_length=8, remasking="low_confidence_static")
    assert out.nfe == 1 + 4 + 1 + 4
    assert out.num_steps == 8
    rev = out.reveal_step[0].tolist()
    assert sorted(rev[:4]) == [0, 1, 2, 3] and sorted(rev[4:]) == [4, 5, 6, 7]
    seq = _gen(w, prompts=[list(range(10, 18))], gen_length=8, remasking="sequential")
    assert seq.reveal_step[0].tolist() == list(range(8))
    # a partial prompt block: 6 prompt tokens -> first decoded block holds 2 prompt + 2 new tokens
    part = _gen(w, prompts=[list(range(10, 16))], gen_length=6, remasking="sequential")
    assert part.reveal_step[0].tolist() == [0, 1, 4, 5, 6, 7]
    assert part.num_steps == 8


def test_dynamic_threshold_reveals_many_per_step(w):
    out = _gen(
        w, prompts=[list(range(10, 18))], gen_length=8, remasking="low_confidence_dynamic", confidence_threshold=0.0
    )
    # every masked candidate beats threshold 0 -> one iteration per block
    assert out.reveal_step[0].tolist() == [0] * 4 + [4] * 4
    assert out.nfe == 1 + 1 + 1 + 1


def test_stop_tokens(w):
    base = _gen(w, prompts=[PROMPTS[0]], gen_length=12, remasking="sequential")
    first = int(base.response_ids[0, 0])
    w2 = make_toy_block_wrapper(seed=3)
    w2.stop_token_ids = (first,)
    out = _gen(w2, prompts=[PROMPTS[0]], gen_length=12, remasking="sequential", stop_at_stop_token=True)
    want = _oracle(w2, PROMPTS[0], 12, 4, "sequential", stop=True)
    assert out.response_ids[0].tolist() == want
    # the first token is a stop token: the rest of its block is decoded, then EOS fill
    tail = 4 - len(PROMPTS[0]) % 4
    assert out.response_ids[0, tail:].tolist() == [w2.eos_token_id] * (12 - tail)
    assert (out.reveal_step[0, tail:] == -1).all()
    assert out.response_mask[0].tolist() == [1] + [0] * 11
    keep = _gen(
        w2, prompts=[PROMPTS[0]], gen_length=12, remasking="sequential", stop_at_stop_token=True, truncate_at_eos=False
    )
    assert keep.response_mask.all()


def test_sampling_is_seeded_and_top_k_one_is_greedy(w):
    a = _gen(w, temperature=1.0, gen_length=12)
    ids, mask = _pad(PROMPTS, w.pad_token_id)
    cfg = BlockRolloutConfig(gen_length=12, temperature=1.0, stop_at_stop_token=False)
    b = BlockSampler(cfg).generate(w, ids, mask, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.response_ids, b.response_ids)
    greedy = _gen(w, gen_length=12, remasking="sequential")
    top1 = _gen(w, temperature=0.7, top_k=1, gen_length=12, remasking="sequential")
    assert torch.equal(greedy.response_ids, top1.response_ids)
    nuc = _gen(w, temperature=0.7, top_p=1e-6, gen_length=12, remasking="sequential")
    assert torch.equal(greedy.response_ids, nuc.response_ids)


def _last_block_entered(ids_mask, R, bs, steps, k):
    """Rows whose last block (the one holding their last response token) global step ``k`` lies
    strictly inside or after."""
    n = ids_mask.sum(1)
    c0 = int((n // bs).max()) * bs
    start = c0 + n % bs
    last = (start + R - 1 - c0) // bs  # decoded-block index of the last response token
    i0, s0 = divmod(k, steps)
    return (last < i0) | ((last == i0) & (s0 > 0))


@pytest.mark.parametrize("strategy", ["low_confidence_static", "low_confidence_dynamic", "sequential"])
@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("stop", [False, True])
def test_resuming_reproduces_the_uninterrupted_run(w, strategy, use_cache, stop):
    """Sampled (T = 1) generation split at every global step k: continue_from(0, k) then
    continue_from(k, end) with the same generator gives the uninterrupted tokens and reveal steps,
    except in rows whose last block k lies inside (its columns past the response are not part of
    the state); those still get a complete response."""
    R, steps = 10, 4
    w2 = make_toy_block_wrapper(seed=3)
    if stop:
        w2.stop_token_ids = tuple(range(40, 80))  # some sampled tokens stop their rows
    cfg = BlockRolloutConfig(
        gen_length=R,
        steps=steps,
        temperature=1.0,
        remasking=strategy,
        use_cache=use_cache,
        stop_at_stop_token=stop,
        confidence_threshold=0.3,
    )
    sampler = BlockSampler(cfg)
    ids, mask = _pad(PROMPTS, w2.pad_token_id)
    whole = sampler.generate(
        w2, ids, mask, record=frozenset({"reveal_step"}), generator=torch.Generator().manual_seed(5)
    )
    total = sampler.total_steps(w2, mask)
    assert total == 4 * steps  # longest tail 3 + 10 tokens -> 4 blocks
    if not stop:
        assert whole.num_steps == total
    for k in range(total + 1):
        gen = torch.Generator().manual_seed(5)
        empty = torch.full((3, R), w2.mask_token_id)
        first = sampler.continue_from(w2, ids, mask, empty, start_step=0, stop_step=k, generator=gen)
        assert (first.reveal_step[first.response_ids == w2.mask_token_id] == -1).all()
        second = sampler.continue_from(w2, ids, mask, first.response_ids, start_step=k, stop_step=total, generator=gen)
        assert not (second.response_ids == w2.mask_token_id).any()
        # this call commits only what the first left masked
        assert not ((second.reveal_step >= 0) & (first.response_ids != w2.mask_token_id)).any()
        exact = ~_last_block_entered(mask, R, 4, steps, k)
        reveal = torch.where(second.reveal_step >= 0, second.reveal_step, first.reveal_step)
        assert torch.equal(second.response_ids[exact], whole.response_ids[exact]), k
        assert torch.equal(reveal[exact], whole.reveal_step[exact]), k
    assert not exact.all()  # the last split points do lie inside some row's last block


def test_resume_errors(w):
    sampler = BlockSampler(BlockRolloutConfig(gen_length=10, steps=4))
    ids, mask = _pad(PROMPTS, w.pad_token_id)
    empty = torch.full((3, 10), w.mask_token_id)
    with pytest.raises(ValueError, match="total_steps=16"):
        sampler.continue_from(w, ids, mask, empty, start_step=0, stop_step=17)
    with pytest.raises(ValueError, match=r"\[B, gen_length\]"):
        sampler.continue_from(w, ids, mask, empty[:, :5], start_step=0, stop_step=4)
    # a state with a masked block before the block it claims to resume in
    with pytest.raises(ValueError, match="more MASK tokens in decoded block 0"):
        sampler.continue_from(w, ids, mask, empty, start_step=8, stop_step=16)


def test_confidence_is_the_unfiltered_tempered_probability():
    s = BlockSampler(BlockRolloutConfig(temperature=0.5, top_k=2))
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0, 0.0]]])
    x0, conf, _ = s._sample(logits, mask_id=4, generator=torch.Generator().manual_seed(0))
    assert int(x0) in (0, 1)  # top-2 filter
    p = torch.exp(logits[0, 0, :4] / 0.5) / torch.exp(logits[0, 0, :4] / 0.5).sum()
    assert conf.item() == pytest.approx(float(p[int(x0)]), rel=1e-6)


def test_entropy_bounded_selection():
    s = BlockSampler(BlockRolloutConfig(remasking="entropy_bounded", eb_threshold=0.5))
    ent = torch.tensor([[0.1, 0.3, 0.2, 0.9]])
    masked = torch.tensor([[True, True, True, True]])
    # sorted 0.1, 0.2, 0.3, 0.9: sums minus max 0, 0.1, 0.3, 0.6 -> first three
    pick = s._select(torch.zeros(1, 4), ent, masked, 1)
    assert pick.tolist() == [[True, True, True, False]]
    tight = BlockSampler(BlockRolloutConfig(remasking="entropy_bounded", eb_threshold=0.0))
    assert tight._select(torch.zeros(1, 4), ent, masked, 2).tolist() == [[True, False, True, False]]
    masked2 = torch.tensor([[False, True, True, True]])
    # sorted 0.2, 0.3, 0.9: sums minus max 0, 0.2, 0.5 -> two within 0.4
    mid = BlockSampler(BlockRolloutConfig(remasking="entropy_bounded", eb_threshold=0.4))
    assert mid._select(torch.zeros(1, 4), ent, masked2, 1).tolist() == [[False, True, True, False]]


def test_errors(w):
    sampler = BlockSampler(BlockRolloutConfig(gen_length=4))
    ids, mask = _pad([[5, 6]], 0)
    with pytest.raises(CapabilityError, match="block-diffusion"):
        sampler.generate(make_toy_wrapper(), ids, mask)
    with pytest.raises(ValueError, match="cannot record"):
        sampler.generate(w, ids, mask, record=frozenset({"states"}))
    _, problems = structure(BlockRolloutConfig, {"remasking": "nope"})
    assert problems


def test_registered_by_the_samplers_plugin(dare_build):
    dare = dare_build(dare_plugin_samplers)
    spec = dare.registries.rollouts.get("block")
    assert spec.kinds == frozenset({"block"}) and "reveal_step" in spec.records
    assert dare.registries.rollouts.owner("block") == dare_plugin_samplers.__name__
