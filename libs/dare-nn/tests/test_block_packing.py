"""Packed BD3LM rows (dare_nn.block_packing): each document's mask, positions and tokens are those
of its own padded layout, nothing crosses documents, and the toy block model's packed
log-probabilities, loss and gradients equal the padded path's."""

from __future__ import annotations

import pytest
import torch

from dare_core.api import DareError, configure_training_paths, select_training_paths
from dare_nn.block import bd3lm_mask, block_index, positions_from_mask
from dare_nn.block_packing import bd3lm_packed_mask, pack_bd3lm
from dare_nn.testing.toy_block import make_toy_block_wrapper

BS = 4
FILL = 0


def _batch(lengths, vocab=60, seed=0):
    """Left-padded prompts and right-padded responses: ``lengths`` = ((prompt, response), ...);
    the response tokens are noised (id 1) at random, at least one per response."""
    g = torch.Generator().manual_seed(seed)
    p, r = max(a for a, _ in lengths), max(b for _, b in lengths)
    clean = torch.full((len(lengths), p + r), FILL)
    mask = torch.zeros_like(clean)
    noisy = clean.clone()
    for i, (a, b) in enumerate(lengths):
        clean[i, p - a : p + b] = torch.randint(4, vocab, (a + b,), generator=g)
        mask[i, p - a : p + b] = 1
        hit = torch.rand(b, generator=g) < 0.5
        hit[torch.randint(0, b, (1,), generator=g)] = True
        noisy[i] = clean[i]
        noisy[i, p : p + b] = torch.where(hit, 1, clean[i, p : p + b])
    return noisy, clean, mask


LENGTHS = ((4, 12), (9, 3), (2, 20), (6, 7), (3, 1), (9, 20), (1, 1))


def test_each_document_gets_its_padded_layout_and_nothing_else():
    noisy, clean, mask = _batch(LENGTHS)
    pack = pack_bd3lm(noisy, clean, BS, mask, FILL)
    rows, width = pack.input_ids.shape
    assert pack.slots == rows * width < pack.padded_slots
    flat_ids, flat_pos = pack.input_ids.reshape(-1), pack.position_ids.reshape(-1)
    seen = torch.zeros(rows * width, dtype=torch.bool)
    for b in range(noisy.shape[0]):
        valid = mask[b].bool()
        pos = positions_from_mask(mask[b : b + 1], (1, mask.shape[1]))[0][valid]
        blocks = block_index(pos, BS)
        in_doc = pack.where[0] == b
        src = pack.source[in_doc]
        assert torch.equal(pack.where[1][in_doc], valid.nonzero().flatten())
        assert torch.equal(flat_pos[src], pos)  # positions restart per document, as padded
        differs = (noisy[b] != clean[b])[valid]
        noisy_blocks = set(blocks[differs].tolist())
        from_noisy = torch.tensor([int(x) in noisy_blocks for x in blocks])
        assert torch.equal(flat_ids[src], torch.where(from_noisy, noisy[b][valid], clean[b][valid]))
        # one segment in one row: the noisy copies of its noisy blocks, then its clean copy
        n_keep, n = int(from_noisy.sum()), int(valid.sum())
        seg = torch.arange(int(src.min()), int(src.min()) + n_keep + n)
        row = int(seg[0]) // width
        assert bool((seg // width == row).all())
        seen[seg] = True
        assert torch.equal(flat_ids[seg], torch.cat([noisy[b][valid][from_noisy], clean[b][valid]]))
        assert torch.equal(flat_pos[seg], torch.cat([pos[from_noisy], pos]))
        want = bd3lm_mask(blocks[None])[0, 0]  # [2n, 2n] over [noisy | clean] of this document
        keep = torch.cat([from_noisy.nonzero().flatten(), torch.arange(n, 2 * n)])
        got = pack.mask[row, 0][seg % width][:, seg % width]
        assert torch.equal(got, want[keep][:, keep])
        # and nothing outside the segment
        others = torch.ones(width, dtype=torch.bool)
        others[seg % width] = False
        assert not bool(pack.mask[row, 0][seg % width][:, others].any())
    # filler slots attend only to themselves
    for s in (~seen).nonzero().flatten().tolist():
        r, c = divmod(s, width)
        assert torch.equal(pack.mask[r, 0, c].nonzero().flatten(), torch.tensor([c]))


def test_packed_mask_rule_by_hand():
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, -1]])
    clean = torch.tensor([[False, True, True, True, False, True, False]])
    blocks = torch.tensor([[1, 0, 1, 1, 0, 0, 0]])
    m = bd3lm_packed_mask(doc, clean, blocks)[0, 0].int().tolist()
    assert m == [
        [1, 1, 0, 0, 0, 0, 0],  # noisy block 1: itself + clean block 0
        [0, 1, 0, 0, 0, 0, 0],  # clean block 0
        [0, 1, 1, 1, 0, 0, 0],  # clean block 1: clean blocks <= 1
        [0, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],  # document 1, noisy block 0: its own block only
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]  # filler: itself


def _toy(attention, ce="naive"):
    w = make_toy_block_wrapper(seed=3, block_size=BS)
    w.capabilities = w.capabilities | {"packed_varlen"}
    configure_training_paths(w, attention, ce, "cpu")
    w.packing_max_slots = 1.0
    return w


def _step(w, noisy, clean, mask, weight):
    for p in w.module.parameters():
        p.grad = None
    logp = w.token_logprobs(noisy, clean, mask, clean_ids=clean)
    loss = -(logp * weight).sum() / weight.sum()
    loss.backward()
    return logp.detach(), loss.detach(), {k: p.grad.clone() for k, p in w.module.named_parameters()}


@pytest.mark.parametrize("ce", ["naive", "fused"])
def test_toy_packed_equals_padded(ce):
    noisy, clean, mask = _batch(LENGTHS)
    weight = ((noisy != clean) & mask.bool()).float() * 1.7
    lp0, l0, g0 = _step(_toy("padded"), noisy, clean, mask, weight)
    w = _toy("packed", ce)
    shapes = []
    w.module.embed.register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
    lp1, l1, g1 = _step(w, noisy, clean, mask, weight)
    assert shapes[0][0] < noisy.shape[0]  # it ran packed
    valid = mask.bool()
    torch.testing.assert_close(lp1[valid], lp0[valid], rtol=1e-5, atol=1e-5)
    assert bool((lp1[~valid] == 0).all())
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-5, msg=k)


def test_without_clean_ids_packed_is_the_block_causal_forward():
    noisy, _, mask = _batch(LENGTHS, seed=4)
    want = _toy("padded").token_logprobs(noisy, noisy, mask)
    got = _toy("packed").token_logprobs(noisy, noisy, mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-5)


def test_little_to_save_runs_padded():
    noisy, clean, mask = _batch(((4, 8), (4, 8)))  # no padding: packing saves nothing
    w = _toy("packed")
    w.packing_max_slots = 0.9
    shapes = []
    w.module.embed.register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
    w.token_logprobs(noisy, clean, mask, clean_ids=clean)
    assert shapes[0][0] == 2


def test_capability_and_kernel_choice():
    w = make_toy_block_wrapper()
    assert not w.supports_packing()
    with pytest.raises(DareError, match="train_attention=padded"):
        select_training_paths(w, "packed", "auto", "cpu")
    w.capabilities = w.capabilities | {"packed_varlen"}
    assert w.supports_packing() and select_training_paths(w, "auto", "auto", "cpu").attention == "packed"
    # FlexAttention's document kernel has no BD3LM form: refused at set-up, in one line
    with pytest.raises(DareError) as e:
        configure_training_paths(w, "packed", "auto", "cuda", attention_kernel="flex")
    assert "\n" not in str(e.value) and "attention_kernel=sdpa_mask" in str(e.value)
