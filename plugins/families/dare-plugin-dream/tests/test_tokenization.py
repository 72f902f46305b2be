"""The published Dream tokenizer layout (remote-code ``DreamTokenizer``: vocab.json + merges.txt,
tokenizer_config.json with ``auto_map`` and ``added_tokens_decoder``, no tokenizer.json) loads
through the native class, alone and as part of a whole checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from dare_core.errors import DareError
from dare_plugin_dream.hf import register_auto_classes
from dare_plugin_dream.tokenization_dream import DreamTokenizer
from dare_plugin_dream.tokenizer import DREAM_CHAT_TEMPLATE, build_tokenizer
from dare_plugin_dream.wrapper import BUNDLED, load

TEXTS = [
    "Solve the sudoku 1 0 3 0 / 0 4 0 2.",
    "<answer>\n3142\n</answer>",
    "hello world, 12 + 30 = 42",
    "The answer is 7 and the grid is full.",
] * 20
# the published order: <|endoftext|>, <|im_start|>, <|im_end|>, more special tokens, non-special
# tool-call / FIM tokens, then <|beginoftext|> and <|mask|>
ADDED = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|beginoftext|>", True),
    ("<|mask|>", True),
)


def write_published_tokenizer(out: str, extras: bool = True, gap: int = 0) -> dict:
    """vocab.json / merges.txt of a small trained BPE and a tokenizer_config.json shaped like the
    published Dream one (``extras``: also added_tokens.json and special_tokens_map.json; ``gap``:
    ids skipped between the vocabulary and <|beginoftext|>); returns the tokenizer config."""
    os.makedirs(out, exist_ok=True)
    build_tokenizer(TEXTS, vocab_size=300).backend_tokenizer.model.save(out)
    with open(os.path.join(out, "vocab.json")) as fh:
        n = len(json.load(fh))
    ids = [n + i + (gap if content in ("<|beginoftext|>", "<|mask|>") else 0) for i, (content, _) in enumerate(ADDED)]
    decoder = {
        str(tid): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for tid, (content, special) in zip(ids, ADDED)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": "<|beginoftext|>",
        "chat_template": DREAM_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "DreamTokenizer",
        "unk_token": None,
    }
    _dump(os.path.join(out, "tokenizer_config.json"), config)
    if extras:
        _dump(os.path.join(out, "added_tokens.json"), {content: tid for tid, (content, _) in zip(ids, ADDED)})
        _dump(
            os.path.join(out, "special_tokens_map.json"),
            {
                "additional_special_tokens": config["additional_special_tokens"],
                "bos_token": "<|beginoftext|>",
                "eos_token": "<|endoftext|>",
                "mask_token": "<|mask|>",
                "pad_token": "<|endoftext|>",
            },
        )
    return config


def _dump(path: str, obj: dict) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2)


def _id(config: dict, content: str) -> int:
    return next(int(tid) for tid, tok in config["added_tokens_decoder"].items() if tok["content"] == content)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A checkpoint directory: the bundled tiny model's weights and config.json (token ids set from
    the new tokenizer's files) with the published tokenizer layout."""
    out = str(tmp_path_factory.mktemp("dream-published"))
    config = write_published_tokenizer(out)
    shutil.copy(os.path.join(BUNDLED, "model.safetensors"), out)
    with open(os.path.join(BUNDLED, "config.json")) as fh:
        model_cfg = json.load(fh)
    eos = _id(config, "<|endoftext|>")
    model_cfg.update(
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        mask_token_id=_id(config, "<|mask|>"),
        auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    )
    _dump(os.path.join(out, "config.json"), model_cfg)
    assert not {"tokenizer.json", "tokenization_dream.py"} & set(os.listdir(out))
    return out, config


@pytest.fixture(scope="module")
def tokenizer(published):
    from transformers import AutoTokenizer

    register_auto_classes()
    return AutoTokenizer.from_pretrained(published[0])


def test_loads_without_remote_code(published, tokenizer):
    from transformers import AutoTokenizer, PretrainedConfig

    assert type(tokenizer) is DreamTokenizer
    # the way the pre-flight check loads it (no model config) resolves to the same class
    assert type(AutoTokenizer.from_pretrained(published[0], config=PretrainedConfig())) is DreamTokenizer


@pytest.mark.parametrize("extras", [False, True])
def test_encode_decode_equal_the_same_bpe(tmp_path, extras):
    from transformers import AutoTokenizer

    register_auto_classes()
    write_published_tokenizer(str(tmp_path), extras=extras)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    bpe = build_tokenizer(TEXTS, vocab_size=300)
    for text in TEXTS[:4] + ["hello world 2024", "Solve the grid: 1 0 / 3 4"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == bpe.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    mixed = "<|im_start|>user\nhéllo wörld ✓ 12<|im_end|>\n<|mask|><|mask|><tool_call>"
    ids = tok.encode(mixed, add_special_tokens=False)
    assert tok.decode(ids) == mixed
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhéllo wörld ✓ 12\n<tool_call>"


def test_added_and_named_token_ids_are_the_files(published, tokenizer):
    config = published[1]
    for tid, entry in config["added_tokens_decoder"].items():
        assert tokenizer.convert_tokens_to_ids(entry["content"]) == int(tid)
        assert tokenizer.convert_ids_to_tokens(int(tid)) == entry["content"]
        assert tokenizer.added_tokens_decoder[int(tid)].special is entry["special"]
        assert tokenizer.encode(entry["content"], add_special_tokens=False) == [int(tid)]
    for name in ("bos", "eos", "pad", "mask"):
        assert getattr(tokenizer, f"{name}_token_id") == _id(config, config[f"{name}_token"])
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    assert len(tokenizer) == max(int(t) for t in config["added_tokens_decoder"]) + 1


def test_chat_template_renders(published, tokenizer):
    config = published[1]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    start, end = _id(config, "<|im_start|>"), _id(config, "<|im_end|>")
    assert ids.count(start) == 3 and ids.count(end) == 2 and ids[0] == start


def test_ids_after_a_gap_are_kept_and_conflicts_refused(tmp_path):
    from transformers import AutoTokenizer

    register_auto_classes()
    config = write_published_tokenizer(str(tmp_path / "gap"), extras=False, gap=7)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "gap"))
    for tid, entry in config["added_tokens_decoder"].items():
        assert tok.convert_tokens_to_ids(entry["content"]) == int(tid)
    assert tok.mask_token_id == _id(config, "<|mask|>")

    bad = tmp_path / "bad"
    config = write_published_tokenizer(str(bad), extras=False)
    mask = str(_id(config, "<|mask|>"))
    config["added_tokens_decoder"]["5"] = config["added_tokens_decoder"].pop(mask)  # 5: a byte of vocab.json
    _dump(str(bad / "tokenizer_config.json"), config)
    with pytest.raises(DareError, match="gives id 5 to '<\\|mask\\|>' but the vocabulary already uses it"):
        AutoTokenizer.from_pretrained(str(bad))


def test_family_load_of_a_published_layout_checkpoint(published, tmp_path):
    import torch
    from transformers import AutoTokenizer

    path, config = published
    wrapper = load(path)
    tok = wrapper.tokenizer
    assert type(tok) is DreamTokenizer
    assert wrapper.mask_token_id == _id(config, "<|mask|>")
    assert wrapper.eos_token_id == wrapper.pad_token_id == _id(config, "<|endoftext|>")
    assert set(wrapper.stop_token_ids) == {_id(config, "<|endoftext|>"), _id(config, "<|im_end|>")}
    prompt = wrapper.encode(wrapper.render_prompt([{"role": "user", "content": "hi"}]))
    assert prompt[0] == _id(config, "<|im_start|>")
    with torch.no_grad():
        logits = wrapper.logits(torch.tensor([prompt]))
    assert logits.shape[:2] == (1, len(prompt)) and torch.isfinite(logits).all()

    # a saved copy (as a training run writes it) reloads with the same ids and no remote-code pointer
    tok.save_pretrained(str(tmp_path))
    with open(tmp_path / "tokenizer_config.json") as fh:
        saved = json.load(fh)
    assert "auto_map" not in saved and saved["tokenizer_class"] == "DreamTokenizer"
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    text = wrapper.render_prompt([{"role": "user", "content": "Solve 1 0 3 0 / 0 4 0 2"}]) + "<|mask|>"
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert again.mask_token_id == tok.mask_token_id


def test_dare_generate_on_a_published_layout_checkpoint(published):
    """``dare generate`` in a fresh process, as a user runs it: nothing of the family is registered
    with transformers before the command's own checks."""
    env = dict(os.environ, DARE_DEBUG="0")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "dare_core.cli",
            "generate",
            "--model",
            "dream",
            f"model.path={published[0]}",
            "--prompt",
            "hi",
            "rollout.gen_length=4",
            "rollout.steps=4",
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("---")
