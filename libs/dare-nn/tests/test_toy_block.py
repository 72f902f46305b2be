"""The family-free block-diffusion toy: mask contract, KV-cache contract, BD3LM training view."""

from __future__ import annotations

import pytest
import torch

from dare_nn.block import block_causal_mask, block_index
from dare_nn.testing import toy_block
from dare_nn.testing.toy_block import make_toy_block_wrapper


@pytest.fixture
def w():
    return make_toy_block_wrapper(seed=1)


def _ids(n, seed=0, B=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 60, (B, n), generator=g)


def test_missing_or_malformed_mask_is_an_error(w):
    ids = _ids(8)
    with pytest.raises(ValueError, match="explicit attention mask"):
        w.module(input_ids=ids)
    with pytest.raises(ValueError, match="boolean"):
        w.module(input_ids=ids, attention_mask=torch.ones(1, 1, 8, 8))
    with pytest.raises(ValueError, match=r"\[B, 1, Q, P\+Q\]"):
        w.module(input_ids=ids, attention_mask=torch.ones(1, 1, 8, 7, dtype=torch.bool))


def test_logits_are_block_causal(w):
    ids = _ids(12)
    base = w.logits(ids)
    later = ids.clone()
    later[0, 8:] = 5  # change block 2
    out = w.logits(later)
    torch.testing.assert_close(out[:, :8], base[:, :8], rtol=0, atol=0)  # blocks 0-1 blind to it
    same_block = ids.clone()
    same_block[0, 7] = 5  # change the last token of block 1
    out = w.logits(same_block)
    assert not torch.allclose(out[0, 4], base[0, 4])  # block 1 is bidirectional
    torch.testing.assert_close(out[:, :4], base[:, :4], rtol=0, atol=0)


def test_left_padding_is_invisible(w):
    ids = _ids(10)
    padded = torch.cat([torch.full((1, 3), w.pad_token_id), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)], 1)
    torch.testing.assert_close(w.logits(padded, mask)[:, 3:], w.logits(ids), rtol=1e-5, atol=1e-5)


def test_cache_equals_full_forward(w):
    ids = _ids(12, B=2)
    pos = torch.arange(12).expand(2, 12)
    full = w.logits(ids)
    # prefill blocks 0-1 with the block-causal mask, then block 2 attending over cache + itself
    blocks = block_index(pos, 4)
    pre_mask = block_causal_mask(blocks[:, :8])
    lg, cache = w.forward_cached(ids[:, :8], position_ids=pos[:, :8], attention_mask=pre_mask)
    assert len(cache) == 2 and cache[0][0].shape == (2, 2, 8, 16)
    torch.testing.assert_close(lg, full[:, :8], rtol=1e-5, atol=1e-5)
    step_mask = torch.ones(2, 1, 4, 12, dtype=torch.bool)
    lg2, cache2 = w.forward_cached(ids[:, 8:], position_ids=pos[:, 8:], past_key_values=cache, attention_mask=step_mask)
    torch.testing.assert_close(lg2, full[:, 8:], rtol=1e-5, atol=1e-5)
    assert cache2[1][0].shape[2] == 12
    # the cached keys are those of a fresh full pass (keys after RoPE, cache first then new)
    _, full_cache = w.forward_cached(ids, position_ids=pos, attention_mask=block_causal_mask(blocks))
    torch.testing.assert_close(cache2[1][0], full_cache[1][0], rtol=1e-5, atol=1e-5)
    # a 2-D key-padding mask is accepted with a cache
    lg3, _ = w.forward_cached(
        ids[:, 8:],
        position_ids=pos[:, 8:],
        past_key_values=cache,
        attention_mask=torch.ones(2, 12, dtype=torch.long),
        use_cache=False,
    )
    torch.testing.assert_close(lg3, lg2, rtol=0, atol=0)


def test_denoise_logits_follow_the_bd3lm_rule(w):
    clean = _ids(12, seed=3)
    noisy = clean.clone()
    noisy[0, [1, 5, 6, 10]] = w.mask_token_id
    base = w.denoise_logits(noisy, None, clean)
    assert base.shape == (1, 12, w.module.vocab_size)
    # noisy block 1 sees clean block 0 ...
    c2 = clean.clone()
    c2[0, 0] = 7
    assert not torch.allclose(w.denoise_logits(noisy, None, c2)[0, 5], base[0, 5])
    # ... but not its own clean block or later ones
    c3 = clean.clone()
    c3[0, 4:] = 7
    torch.testing.assert_close(w.denoise_logits(noisy, None, c3)[:, :8], base[:, :8], rtol=0, atol=0)
    # noisy tokens of other blocks are invisible
    n2 = noisy.clone()
    n2[0, 10] = 9
    torch.testing.assert_close(w.denoise_logits(n2, None, clean)[:, :8], base[:, :8], rtol=0, atol=0)
    # clean == noisy gives the inference logits
    torch.testing.assert_close(w.denoise_logits(clean, None, clean), w.logits(clean), rtol=1e-5, atol=1e-5)
    assert w.denoise_logits(noisy).shape == base.shape
    # the hidden-state view (fused cross entropy) is the same computation before the head
    head = w.module.get_output_embeddings()
    torch.testing.assert_close(head(w.denoise_hidden(noisy, None, clean)), base, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head(w.denoise_hidden(noisy)), w.denoise_logits(noisy), rtol=1e-5, atol=1e-5)


def test_hidden_and_head(w):
    ids = _ids(8)
    mask = block_causal_mask(block_index(torch.arange(8)[None], 4))
    h = w.module.forward_hidden(ids, mask)
    torch.testing.assert_close(w.module.get_output_embeddings()(h), w.logits(ids), rtol=0, atol=0)


def test_save_load_and_registration(w, tmp_path, dare_build):
    w.save_pretrained(str(tmp_path / "m"))
    again = toy_block.load(str(tmp_path / "m"))
    ids = _ids(8)
    torch.testing.assert_close(again.logits(ids), w.logits(ids), rtol=0, atol=0)
    dare = dare_build(toy_block)
    spec = dare.registries.models.get("block_toy")
    assert spec.kind == "block" and spec.block_size == 4 and "kv_cache" in spec.capabilities


def test_compact_layout_equals_full_bd3lm(w):
    """Dropping the noise-free leading noisy blocks changes nothing (left padding, several rows)."""
    from dare_nn.block import bd3lm_compact_layout, bd3lm_layout

    clean = _ids(14, seed=5, B=3)
    att = torch.ones(3, 14, dtype=torch.long)
    att[1, :3] = 0
    att[2, :5] = 0
    clean = clean.masked_fill(att == 0, w.pad_token_id)
    noisy = clean.clone()
    noisy[0, [9, 12]] = w.mask_token_id
    noisy[1, 11] = w.mask_token_id
    noisy[2, [10, 13]] = w.mask_token_id
    ids, pos, mask = bd3lm_layout(noisy, clean, 4, att)
    with torch.no_grad():
        full = w.module(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, :14]
        compact = w.denoise_logits(noisy, att, clean)
    _, _, _, c0, _ = bd3lm_compact_layout(noisy, clean, 4, att)
    assert c0 == 8  # row 0: block of column 9 starts at 8; row 1 (3 pads): column 11 -> block [11, 15);
    # row 2 (5 pads): column 10 -> block starting at column 9; the minimum is 8
    real = att.bool()
    torch.testing.assert_close(compact[real], full[real], rtol=1e-5, atol=1e-5)
    # nothing noised: the whole noisy half is dropped and the inference logits come back
    with torch.no_grad():
        same = w.denoise_logits(clean, att, clean)
    torch.testing.assert_close(same[real], w.logits(clean, att)[real], rtol=1e-5, atol=1e-5)
