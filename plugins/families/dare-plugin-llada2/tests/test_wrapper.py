"""The LLaDA2 wrapper: chat template (plugin README), token ids from the checkpoint, block-causal
inference logits, the BD3LM training layout (full and compact), cached forward, CLI generate."""

import pytest
import torch
from click.testing import CliRunner

import dare_plugin_llada2
from dare_nn.block import bd3lm_layout
from dare_plugin_llada2.tokenizer import LLADA2_CHAT_TEMPLATE, build_tokenizer
from dare_plugin_llada2.wrapper import load


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return tiny_dir


@pytest.fixture(scope="module")
def wrapper(tiny):
    return load(tiny)


def test_chat_template_is_llada2s():
    tok = build_tokenizer(["hello world"] * 4, vocab_size=300)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Sum?"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<role>SYSTEM</role>Be brief.\ndetailed thinking off<|role_end|>"
        "<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>Hello<|role_end|>"
        "<role>HUMAN</role>Sum?<|role_end|><role>ASSISTANT</role>"
    )
    bare = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=False)
    assert bare == "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>x<|role_end|>"
    assert tok.chat_template == LLADA2_CHAT_TEMPLATE
    for t in ("<role>", "</role>", "<|role_end|>", "<|mask|>", "<|endoftext|>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1


def test_ids_come_from_the_checkpoint(wrapper):
    tok = wrapper.tokenizer
    cfg = wrapper.module.config
    assert wrapper.mask_token_id == cfg.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")
    assert wrapper.eos_token_id == cfg.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert wrapper.pad_token_id == cfg.pad_token_id
    assert wrapper.kind == "block" and wrapper.block_size == 4 and wrapper.logit_shift == 0
    assert load(wrapper_path(wrapper), block_size=8).block_size == 8


def wrapper_path(w):
    return w.module.config._name_or_path


def test_logits_are_block_causal(wrapper):
    ids = torch.tensor([wrapper.encode("hello world, solve 1 + 2 = 3 now")])
    assert ids.shape[1] > 9
    other = ids.clone()
    other[0, 9] = wrapper.mask_token_id  # block 2 (positions 8..11)
    a, b = wrapper.logits(ids), wrapper.logits(other)
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=0)  # earlier blocks never see it
    assert not torch.allclose(a[0, 8], b[0, 8])  # same block: bidirectional


def test_left_padding_is_invisible(wrapper):
    ids = torch.tensor([wrapper.encode("hello world 1 2 3")])
    padded = torch.cat([torch.full((1, 3), wrapper.pad_token_id), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    torch.testing.assert_close(wrapper.logits(ids), wrapper.logits(padded, mask)[:, 3:], rtol=1e-5, atol=1e-5)


def test_denoise_logits_use_the_bd3lm_layout(wrapper):
    torch.manual_seed(1)
    clean = torch.tensor([wrapper.encode("hello world, solve 1 + 2 = 3 now and 4 + 5")] * 2)
    L = clean.shape[1]
    am = torch.ones_like(clean)
    am[1, :2] = 0
    noisy = clean.clone()
    noisy[:, L - 6 :] = torch.where(torch.rand(2, 6) < 0.5, wrapper.mask_token_id, clean[:, L - 6 :])
    noisy[0, 1] = wrapper.mask_token_id
    ids, pos, mask = bd3lm_layout(noisy, clean, wrapper.block_size, am)
    want = wrapper.module(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, :L]
    valid = am.bool()
    for compact in (False, True):
        wrapper.compact_layout = compact
        got = wrapper.denoise_logits(noisy, am, clean)
        torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-5)
        hidden = wrapper.denoise_hidden(noisy, am, clean)
        torch.testing.assert_close(wrapper.module.lm_head(hidden)[valid], want[valid], rtol=1e-5, atol=1e-5)
    # the clean half matters: the noisy copy of a later block sees the clean earlier blocks
    other = clean.clone()
    other[:, 0] = (other[:, 0] + 1) % 50 + 10
    assert not torch.allclose(wrapper.denoise_logits(noisy, am, other)[0, -1], want[0, -1])


def test_forward_cached_matches_full_logits(wrapper):
    ids = torch.tensor([wrapper.encode("hello world, solve 1 + 2 = 3")])[:, :12]
    full = wrapper.logits(ids)
    pos = torch.arange(12)[None]
    _, cache = wrapper.forward_cached(ids[:, :8], position_ids=pos[:, :8])
    logits, new = wrapper.forward_cached(ids[:, 8:], position_ids=pos[:, 8:], past_key_values=cache)
    torch.testing.assert_close(logits, full[:, 8:], rtol=1e-5, atol=1e-5)
    assert new[0][0].shape[2] == 12


def test_cli_generate(tiny, monkeypatch):
    from dare_core import plugins
    from dare_core.cli import cli
    from dare_core.testing.registries import build_for

    monkeypatch.setattr(plugins, "_DARE", build_for(dare_plugin_llada2))
    for backend in ("llada2_threshold", "llada2_editing", "block"):
        result = CliRunner().invoke(
            cli,
            [
                "generate",
                "--model",
                "llada2",
                "--prompt",
                "Solve 1 + 2",
                f"model.path={tiny}",
                f"rollout.backend={backend}",
                "rollout.gen_length=8",
            ],
        )
        assert result.exit_code == 0, result.output
        assert "---" in result.output
