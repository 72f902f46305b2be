"""The KV-cache contract on the family-free toy model and ``HFDiffusionWrapper.forward_cached``.

Oracle: a cache-free full forward. With the cache taken from a full forward of the *same*
sequence, a cached forward of the remaining positions must reproduce the full forward's logits
(bidirectional attention: every key the query needs is either cached or new), whatever the order
of the cached positions, with padding masked the same way.
"""

from __future__ import annotations

import pytest
import torch

from dare_core.testing.toy import ToyWrapper, make_toy_wrapper

ATOL = 1e-5


@pytest.fixture
def wrapper():
    w = make_toy_wrapper(seed=1)
    w.module.eval()
    return w


def _ids(b=3, length=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 60, (b, length), generator=g)


def _take(kv, cols):
    return [(k[:, :, cols], v[:, :, cols]) for k, v in kv]


def test_full_forward_matches_logits_and_returns_cache(wrapper):
    x = _ids()
    pos = torch.arange(x.shape[1]).expand_as(x)
    with torch.no_grad():
        logits, present = wrapper.forward_cached(x, position_ids=pos, use_cache=True)
        ref = wrapper.logits(x)
        no_cache, none = wrapper.forward_cached(x, position_ids=pos, use_cache=False)
    assert torch.equal(logits, ref) and torch.equal(no_cache, ref)
    assert none is None
    ((k, v),) = present
    heads, hd = wrapper.module.heads, wrapper.module.dim // wrapper.module.heads
    assert k.shape == v.shape == (3, heads, 20, hd)


@pytest.mark.parametrize("order", ["natural", "shuffled"])
def test_dual_cache_block_matches_full(wrapper, order):
    x = _ids()
    L = x.shape[1]
    pos = torch.arange(L).expand_as(x)
    lo, hi = 8, 12
    cached = torch.cat([torch.arange(lo), torch.arange(hi, L)])
    if order == "shuffled":
        cached = cached[torch.randperm(len(cached), generator=torch.Generator().manual_seed(3))]
    with torch.no_grad():
        full, present = wrapper.forward_cached(x, position_ids=pos, use_cache=True)
        blk, new = wrapper.forward_cached(
            x[:, lo:hi], position_ids=pos[:, lo:hi], past_key_values=_take(present, cached), use_cache=True
        )
    assert torch.allclose(blk, full[:, lo:hi], atol=ATOL)
    # the returned cache is the old cache then the new tokens
    assert new[0][0].shape[2] == L
    assert torch.allclose(new[0][0][:, :, -4:], present[0][0][:, :, lo:hi], atol=ATOL)


def test_prefix_cache_suffix_matches_full(wrapper):
    x = _ids()
    pos = torch.arange(x.shape[1]).expand_as(x)
    with torch.no_grad():
        full, present = wrapper.forward_cached(x, position_ids=pos, use_cache=True)
        tail, _ = wrapper.forward_cached(
            x[:, 6:], position_ids=pos[:, 6:], past_key_values=_take(present, torch.arange(6)), use_cache=False
        )
    assert torch.allclose(tail, full[:, 6:], atol=ATOL)


def test_padding_masks_with_a_cache(wrapper):
    """Left padding: 2-D key masks list the cache first; a 4-D bool mask does the same."""
    x = _ids()
    L = x.shape[1]
    valid = torch.ones(3, L, dtype=torch.long)
    valid[0, :5] = 0
    valid[2, :2] = 0
    x[0, :5] = wrapper.pad_token_id
    pos = torch.arange(L).expand_as(x)
    lo, hi = 10, 14
    cached = torch.cat([torch.arange(lo), torch.arange(hi, L)])
    keys = torch.cat([valid[:, cached], valid[:, lo:hi]], dim=1)
    with torch.no_grad():
        full, present = wrapper.forward_cached(x, position_ids=pos, attention_mask=valid, use_cache=True)
        assert torch.equal(full, wrapper.logits(x, valid))
        two_d, _ = wrapper.forward_cached(
            x[:, lo:hi],
            position_ids=pos[:, lo:hi],
            past_key_values=_take(present, cached),
            attention_mask=keys,
            use_cache=False,
        )
        four_d = keys.bool()[:, None, None, :].expand(3, 1, hi - lo, L)
        via_4d, _ = wrapper.forward_cached(
            x[:, lo:hi],
            position_ids=pos[:, lo:hi],
            past_key_values=_take(present, cached),
            attention_mask=four_d,
            use_cache=False,
        )
        unmasked, _ = wrapper.forward_cached(
            x[:, lo:hi], position_ids=pos[:, lo:hi], past_key_values=_take(present, cached), use_cache=False
        )
    assert torch.allclose(two_d, full[:, lo:hi], atol=ATOL)
    assert torch.allclose(via_4d, full[:, lo:hi], atol=ATOL)
    # the mask matters: attending the padding changes the padded row
    assert not torch.allclose(unmasked[0], full[0, lo:hi], atol=ATOL)
    assert torch.allclose(unmasked[1], full[1, lo:hi], atol=ATOL)


class ShiftedToy(ToyWrapper):
    """A toy wrapper declared AR-shifted: aligned logit ``i`` is raw logit ``i - 1``."""

    logit_shift = 1

    def align(self, logits):
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def _shifted(seed=1):
    base = make_toy_wrapper(seed=seed)
    w = ShiftedToy(
        family="toy",
        module=base.module,
        tokenizer=base.tokenizer,
        kind="masked",
        mask_token_id=base.mask_token_id,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id,
        capabilities=base.capabilities,
    )
    w.module.eval()
    return w


def test_shifted_family_cached_logits_cover_input_after_the_look_behind():
    w = _shifted()
    x = _ids()
    L = x.shape[1]
    pos = torch.arange(L).expand_as(x)
    lo, hi = 8, 12
    with torch.no_grad():
        aligned = w.logits(x)
        full, present = w.forward_cached(x, position_ids=pos, use_cache=True)
        # the full query starts at column 0, so its aligned logits cover columns 1 .. L-1
        assert full.shape[1] == L - 1
        assert torch.equal(full, aligned[:, 1:])
        # dual cache: query [lo - 1, hi); the look-behind column lo - 1 is not in the cache
        cached = torch.cat([torch.arange(lo - 1), torch.arange(hi, L)])
        blk, _ = w.forward_cached(
            x[:, lo - 1 : hi], position_ids=pos[:, lo - 1 : hi], past_key_values=_take(present, cached), use_cache=False
        )
    assert blk.shape[1] == hi - lo
    assert torch.allclose(blk, aligned[:, lo:hi], atol=ATOL)


def test_bad_cache_is_rejected(wrapper):
    x = _ids()
    pos = torch.arange(x.shape[1]).expand_as(x)
    with pytest.raises(ValueError):
        wrapper.forward_cached(x, position_ids=pos, past_key_values=[1, 2])
    with torch.no_grad():
        _, present = wrapper.forward_cached(x, position_ids=pos, use_cache=True)
    with pytest.raises(ValueError):  # a 2-D mask must cover cache + new tokens
        wrapper.forward_cached(
            x[:, :4],
            position_ids=pos[:, :4],
            past_key_values=present,
            attention_mask=torch.zeros(3, 4, dtype=torch.long),
        )
