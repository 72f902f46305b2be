"""Block-diffusion attention layouts checked entry by entry against the BD3LM rules."""

import pytest
import torch

from dare_nn.block import (
    bd3lm_layout,
    bd3lm_mask,
    block_causal_mask,
    block_index,
    positions_from_mask,
)


def _rule(q: int, k: int, L: int, bs: int) -> bool:
    """The BD3LM mask (arXiv:2503.09573), written as the four cases with explicit halves."""
    q_noisy, k_noisy = q < L, k < L
    qb, kb = (q % L) // bs, (k % L) // bs
    if q_noisy and k_noisy:
        return qb == kb
    if q_noisy and not k_noisy:
        return kb < qb
    if not q_noisy and k_noisy:
        return False
    return kb <= qb


def test_bd3lm_mask_matches_the_four_rules():
    L, bs = 6, 2
    ids = torch.arange(L)[None]
    noisy = torch.full_like(ids, 99)
    inp, pos, mask = bd3lm_layout(noisy, ids, bs)
    assert inp.tolist() == [[99] * L + list(range(L))]
    assert pos.tolist() == [list(range(L)) * 2]
    assert mask.shape == (1, 1, 2 * L, 2 * L) and mask.dtype == torch.bool
    expected = [[_rule(q, k, L, bs) for k in range(2 * L)] for q in range(2 * L)]
    assert mask[0, 0].tolist() == expected
    # a concrete row: noisy token 3 (block 1) sees noisy 2,3 and clean 0,1 only
    assert mask[0, 0, 3].nonzero().flatten().tolist() == [2, 3, 6, 7]


def test_left_padding_blocks_count_from_first_real_token():
    am = torch.tensor([[0, 0, 1, 1, 1, 1]])
    pos = positions_from_mask(am, am.shape)
    assert pos.tolist() == [[0, 0, 0, 1, 2, 3]]
    bids = block_index(pos, 2)
    m = bd3lm_mask(bids, am)[0, 0]
    L = 6
    # padded keys are hidden from every real query
    for q in range(2 * L):
        if am[0, q % L]:
            assert not m[q, 0] and not m[q, 1] and not m[q, L] and not m[q, L + 1]
    # padded queries see only themselves
    assert m[0].nonzero().flatten().tolist() == [0]
    assert m[L + 1].nonzero().flatten().tolist() == [L + 1]
    # real noisy token at slot 4 (position 2, block 1) sees noisy slots 4,5 and clean slots 2,3
    assert m[4].nonzero().flatten().tolist() == [4, 5, L + 2, L + 3]


def test_block_causal_inference_mask_and_cache_keys():
    bids = block_index(torch.arange(5)[None], 2)  # blocks 0 0 1 1 2
    m = block_causal_mask(bids)[0, 0].int().tolist()
    assert m == [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    # queries = block 2 only, keys = a cache of blocks 0..1 then the queries
    q = torch.tensor([[2, 2]])
    k = torch.tensor([[0, 0, 1, 1, 2, 2]])
    km = torch.tensor([[0, 1, 1, 1, 1, 1]])
    m2 = block_causal_mask(q, key_block_ids=k, key_mask=km)
    assert m2.shape == (1, 1, 2, 6)
    assert m2[0, 0].int().tolist() == [[0, 1, 1, 1, 1, 1]] * 2


def test_bad_inputs_are_clear():
    with pytest.raises(ValueError, match="block_size"):
        block_index(torch.arange(3), 0)
    with pytest.raises(ValueError, match="differ in shape"):
        bd3lm_layout(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="2-D"):
        bd3lm_mask(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 1, 3))
