"""The Dream wrapper: the logit shift, cached forward, training paths, token ids, chat template."""

from __future__ import annotations

import pytest
import torch

from dare_core.errors import DareError
from dare_plugin_dream.wrapper import DreamWrapper, create, load, shift_logits


def _prompt(wrapper, text="Solve 1 0 3 0"):
    return torch.tensor([wrapper.encode(wrapper.render_prompt([{"role": "user", "content": text}]))])


def test_shift_by_hand():
    raw = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    out = shift_logits(raw)
    assert torch.equal(out[:, 0], raw[:, 0])  # position 0 duplicates output 0
    for i in range(1, 4):
        assert torch.equal(out[:, i], raw[:, i - 1])  # aligned i = raw i - 1
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    padded = shift_logits(raw, mask)
    assert torch.equal(padded[0, 2], raw[0, 2])  # first real token after padding keeps its own
    assert torch.equal(padded[0, 3], raw[0, 2])
    assert torch.equal(padded[1], out[1])
    assert shift_logits(raw[:, :0]).shape == (2, 0, 3)


def test_wrapper_logits_are_the_shifted_raw_logits(wrapper):
    assert isinstance(wrapper, DreamWrapper) and wrapper.logit_shift == 1
    ids = _prompt(wrapper)
    with torch.no_grad():
        raw = wrapper.module(ids).logits
        aligned = wrapper.logits(ids)
        lp = wrapper.token_logprobs(ids, ids)
    torch.testing.assert_close(aligned[:, 1:], raw[:, :-1], rtol=0, atol=0)
    torch.testing.assert_close(aligned[:, 0], raw[:, 0], rtol=0, atol=0)
    # log p(token i) is read from the raw output at i - 1 (hand computation)
    i = ids.shape[1] - 1
    want = torch.log_softmax(raw[0, i - 1].double(), -1)[ids[0, i]]
    assert abs(float(lp[0, i]) - float(want)) < 1e-5


def test_left_padding_and_response_position(wrapper):
    ids = _prompt(wrapper)
    resp = torch.full((1, 5), wrapper.mask_token_id)
    full = torch.cat([ids, resp], 1)
    padded = torch.cat([torch.full((1, 4), wrapper.pad_token_id), full], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(full)], 1)
    with torch.no_grad():
        a = wrapper.logits(full)
        b = wrapper.logits(padded, mask)
        raw = wrapper.module(full).logits
    torch.testing.assert_close(b[:, 4:], a, rtol=1e-4, atol=1e-4)
    # the first response position reads the raw logit of the last prompt token
    P = ids.shape[1]
    torch.testing.assert_close(a[:, P], raw[:, P - 1], rtol=0, atol=0)


@pytest.mark.parametrize("start", [1, 7])
def test_forward_cached_matches_full_forward(wrapper, start):
    """Contract 2: the query starts one look-behind position before the first wanted position;
    the cache (here from a full forward, so bidirectional results must match) holds the
    positions before the look-behind one."""
    ids = torch.cat([_prompt(wrapper), torch.full((1, 6), wrapper.mask_token_id)], 1).repeat(2, 1)
    ids[1, -1] = wrapper.eos_token_id
    L = ids.shape[1]
    with torch.no_grad():
        aligned = wrapper.logits(ids)
        full = wrapper.module(ids, use_cache=True).past_key_values
        cache = [(k[:, :, : start - 1], v[:, :, : start - 1]) for k, v in full]
        logits, present = wrapper.forward_cached(
            ids[:, start - 1 :],
            position_ids=torch.arange(start - 1, L)[None].expand(2, -1),
            past_key_values=cache if start > 1 else None,
        )
    assert logits.shape == (2, L - start, aligned.shape[-1])
    torch.testing.assert_close(logits, aligned[:, start:], rtol=1e-5, atol=1e-5)
    assert len(present) == len(full) and present[0][0].shape[2] == L
    with torch.no_grad():
        _, none = wrapper.forward_cached(ids, position_ids=torch.arange(L)[None], use_cache=False)
    assert none is None


def test_fused_and_packed_training_paths_equal_the_plain_one(wrapper):
    ids = torch.cat([_prompt(wrapper), torch.full((1, 6), wrapper.mask_token_id)], 1)
    short = torch.cat([_prompt(wrapper, "a")[:, -8:], torch.full((1, 6), wrapper.mask_token_id)], 1)
    L = ids.shape[1]
    batch = torch.full((2, L), wrapper.pad_token_id)
    batch[0] = ids[0]
    batch[1, L - short.shape[1] :] = short[0]
    mask = (torch.arange(L)[None] >= torch.tensor([[0], [L - short.shape[1]]])).long()
    targets = torch.randint(0, 200, (2, L), generator=torch.Generator().manual_seed(0))
    assert wrapper.supports_fused_ce() and wrapper.supports_packing()
    try:
        with torch.no_grad():
            plain = wrapper.token_logprobs(batch, targets, mask)
            wrapper.fused_ce = True
            fused = wrapper.token_logprobs(batch, targets, mask)
            wrapper.train_attention = "packed"
            packed = wrapper.token_logprobs(batch, targets, mask)
            wrapper.fused_ce = False
            packed_plain = wrapper.token_logprobs(batch, targets, mask)
    finally:
        wrapper.fused_ce, wrapper.train_attention = False, "padded"
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    # packing: every valid position except the first real token of a padded row (whose
    # left neighbour is padding; never a training target) matches
    valid = mask.bool().clone()
    valid[1, L - short.shape[1]] = False
    for other in (packed, packed_plain):
        torch.testing.assert_close(other[valid], plain[valid], rtol=1e-4, atol=1e-4)


def test_token_ids_come_from_the_checkpoint(wrapper):
    tok = wrapper.tokenizer
    cfg = wrapper.module.config
    assert wrapper.mask_token_id == cfg.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")
    assert wrapper.eos_token_id == cfg.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert wrapper.pad_token_id == cfg.pad_token_id == wrapper.eos_token_id
    assert tok.convert_tokens_to_ids("<|im_end|>") in wrapper.stop_token_ids
    assert {"bidirectional", "kv_cache"} <= wrapper.capabilities and wrapper.kind == "masked"


def test_chat_template_is_qwen25(wrapper):
    user = [{"role": "user", "content": "hi 12"}]
    assert wrapper.render_prompt(user) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi 12<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}] + user + [{"role": "assistant", "content": "ok"}]
    text = wrapper.tokenizer.apply_chat_template(with_system, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi 12<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
    )
    ids = wrapper.encode(wrapper.render_prompt(user))
    start = wrapper.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == start and ids.count(start) == 3
    assert wrapper.decode(ids).endswith("assistant\n")
    digits = wrapper.tokenizer.convert_ids_to_tokens(wrapper.encode("1234"))
    assert digits == ["1", "2", "3", "4"]


def test_load_and_create_errors(tmp_path, tiny_ckpt):
    with pytest.raises(DareError):
        load(str(tmp_path / "missing"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "llada"}')
    with pytest.raises(DareError, match="llada"):
        load(str(tmp_path / "other"))
    with pytest.raises(DareError, match="not_a_field"):
        create(str(tmp_path / "x"), ["a b"] * 4, not_a_field=3)
    with pytest.raises(DareError):
        create(str(tmp_path / "y"), ["a b"] * 4, hidden_size=30, num_attention_heads=4)
