"""Tests of the small LLaDA-style BPE tokenizer."""

from __future__ import annotations

import json

import pytest

from dare_plugin_llada.tokenizer import SPECIAL_TOKENS, build_tokenizer

CORPUS = [
    "Question: what is 123 + 456?\nAnswer: 579.",
    "<reasoning>Add the digits column by column.</reasoning>\n<answer>579</answer>",
    "Sudoku 4x4:\n1 0 3 0\n0 4 0 2\n2 0 4 0\n0 3 0 1",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Tabs\tand  double  spaces, trailing space ",
] * 8

ROUND_TRIP = [
    "Question: what is 123 + 456?\nAnswer: 579.",
    "<answer>42</answer>",
    "  leading spaces and trailing  \n",
    "line1\n\nline3\r\nwindows\ttab",
    "9876543210 0.5 -17 3e8",
    "unseen words: zebra quartz xylophone!",
    "mixed <reasoning>\nstep 1: 2*3=6\n</reasoning>\n<answer> 6 </answer>",
    "",
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, vocab_size=400)


def test_special_tokens_and_ids(tok):
    assert len(tok) <= 400
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(8))
    assert tok.bos_token == "<|startoftext|>" and tok.bos_token_id == 0
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 1
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 1
    assert tok.mask_token == "<|mdm_mask|>" and tok.mask_token_id == 2
    assert set(SPECIAL_TOKENS) <= set(tok.all_special_tokens)
    # Special tokens inside text are single ids and are never split.
    ids = tok.encode("a<|mdm_mask|><|mdm_mask|><role>b</role><|eot_id|>", add_special_tokens=True)
    assert ids.count(2) == 2 and 6 in ids and 7 in ids and 5 in ids
    # No BOS/EOS added by encode (the chat template inserts BOS).
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)
    assert 0 not in tok.encode("hello") and 1 not in tok.encode("hello")


def test_digits_are_split_individually(tok):
    for text in ("12345", "x=2024;", " 99 ", "3.14159"):
        pieces = tok.convert_ids_to_tokens(tok.encode(text))
        assert all(not any(c.isdigit() for c in p) or len(p) == 1 for p in pieces), pieces
        assert sum(p.isdigit() for p in pieces) == sum(c.isdigit() for c in text)
    for token in tok.get_vocab():
        if token not in SPECIAL_TOKENS and any(c.isdigit() for c in token):
            assert len(token) == 1, token
    assert len({tok.convert_tokens_to_ids(str(d)) for d in range(10)}) == 10


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_decode_encode_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == text


def test_special_tokens_skipped_on_decode(tok):
    ids = tok.encode("<|startoftext|>hi 1<|mdm_mask|><|eot_id|>")
    assert tok.decode(ids, skip_special_tokens=True) == "hi 1"


def test_chat_template_exact_string(tok):
    messages = [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "\nAnd 4+4? "},
    ]
    expected = (
        "<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n5<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 4+4?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    for gen in (False, True):
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == expected
    single = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert single == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, return_dict=False)
    assert ids == tok.encode(single)
    assert ids[:2] == [0, 3] and ids.count(0) == 1 and ids[-3:-2] == [4]


def test_save_and_autotokenizer_reload(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["mask_token"] == "<|mdm_mask|>"
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.get_vocab() == tok.get_vocab()
    assert reloaded.chat_template == tok.chat_template
    for attr in (
        "bos_token",
        "eos_token",
        "pad_token",
        "mask_token",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "mask_token_id",
    ):
        assert getattr(reloaded, attr) == getattr(tok, attr), attr
    assert reloaded.all_special_tokens == tok.all_special_tokens
    for text in ROUND_TRIP + ["<|startoftext|>a<|mdm_mask|>"]:
        assert reloaded.encode(text) == tok.encode(text)
        assert reloaded.decode(reloaded.encode(text), skip_special_tokens=True) == tok.decode(
            tok.encode(text), skip_special_tokens=True
        )
    messages = [{"role": "user", "content": "7*6?"}]
    assert reloaded.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(messages, tokenize=False)

    # The template can also be stored inside tokenizer_config.json.
    legacy = tmp_path / "legacy"
    tok.save_pretrained(legacy, save_jinja_files=False)
    assert json.loads((legacy / "tokenizer_config.json").read_text())["chat_template"] == tok.chat_template
    assert AutoTokenizer.from_pretrained(legacy).chat_template == tok.chat_template


def test_deterministic():
    a = build_tokenizer(CORPUS, vocab_size=350)
    b = build_tokenizer(list(CORPUS), vocab_size=350)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_bad_arguments():
    with pytest.raises(ValueError):
        build_tokenizer(CORPUS, vocab_size=100)
    with pytest.raises(TypeError):
        build_tokenizer("not a list")  # type: ignore[arg-type]
