"""The SDAR wrapper: token ids, chat template, block-causal inference, BD3LM training view, cache."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import dare_plugin_sdar
from dare_core.testing.contracts import ModelFamilyContract
from dare_core.workflows.batching import left_pad
from dare_plugin_samplers.block import BlockRolloutConfig, BlockSampler
from dare_plugin_sdar.wrapper import create, load

TEXTS = ["Solve the puzzle: 3102", "<answer>\n3142\n</answer>", "hello world 1234"] * 20
SIZES = dict(
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=24,
    num_hidden_layers=2,
    intermediate_size=48,
    vocab_size=320,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sdar") / "tiny")
    torch.manual_seed(0)
    create(out, TEXTS, **SIZES)
    return out


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sdar_moe") / "tiny")
    torch.manual_seed(0)
    create(out, TEXTS, model_type="sdar_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, **SIZES)
    return out


@pytest.fixture(scope="module")
def w(ckpt):
    return load(ckpt)


def test_token_ids_and_layout_come_from_the_checkpoint(w, ckpt):
    tok = w.tokenizer
    assert w.kind == "block" and w.block_size == 4 and w.logit_shift == 0
    assert w.mask_token_id == tok.convert_tokens_to_ids("<|MASK|>") == w.module.config.mask_token_id
    assert w.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert w.pad_token_id == w.eos_token_id
    assert w.stop_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"), w.eos_token_id)
    gen = json.load(open(f"{ckpt}/generation_config.json"))
    assert gen["eos_token_id"] == list(w.stop_token_ids)
    cfg = json.load(open(f"{ckpt}/config.json"))
    assert cfg["model_type"] == "sdar" and cfg["head_dim"] == 24 and cfg["block_size"] == 4
    assert "pad_token_id" not in cfg or cfg["pad_token_id"] is None


def test_chat_template_disables_thinking(w):
    text = w.render_prompt([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _hand_block_causal(valid, bs):
    """[B, 1, L, L] from a 2-D left-padding mask, with explicit loops."""
    B, L = valid.shape
    out = torch.zeros(B, 1, L, L, dtype=torch.bool)
    for b in range(B):
        first = int((valid[b] == 0).sum())
        for i in range(L):
            for j in range(L):
                if valid[b, i] and valid[b, j]:
                    out[b, 0, i, j] = (j - first) // bs <= (i - first) // bs
            if not valid[b, i]:
                out[b, 0, i, i] = True
    return out


def test_logits_use_the_block_causal_mask_and_ignore_left_padding(w):
    ids = torch.tensor([w.encode("Solve the puzzle: 3102 hello")])
    L = ids.shape[1]
    pad = 3
    padded = torch.cat([torch.full((1, pad), w.pad_token_id), ids], 1)
    valid = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, L, dtype=torch.long)], 1)
    with torch.no_grad():
        got = w.logits(padded, valid)
        pos = (valid.cumsum(1) - 1).clamp_min(0)
        want = w.module(padded, attention_mask=_hand_block_causal(valid, 4), position_ids=pos).logits
        plain = w.logits(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got[:, pad:], plain, rtol=1e-5, atol=1e-5)


def _hand_bd3lm(valid, bs):
    """BD3LM mask over [noisy | clean] from the BD3LM rules (arXiv:2503.09573), by loops."""
    B, L = valid.shape
    out = torch.zeros(B, 1, 2 * L, 2 * L, dtype=torch.bool)
    for b in range(B):
        first = int((valid[b] == 0).sum())
        blk = [(i - first) // bs for i in range(L)]
        for qi in range(2 * L):
            for ki in range(2 * L):
                qn, kn = qi < L, ki < L
                i, j = qi % L, ki % L
                if not (valid[b, i] and valid[b, j]):
                    continue
                if qn and kn:
                    ok = blk[j] == blk[i]
                elif qn and not kn:
                    ok = blk[j] < blk[i]
                elif not qn and not kn:
                    ok = blk[j] <= blk[i]
                else:
                    ok = False
                out[b, 0, qi, ki] = ok
            if not valid[b, qi % L]:
                out[b, 0, qi, qi] = True
    return out


def test_denoise_logits_use_the_bd3lm_layout(w):
    clean = torch.tensor([w.encode("Solve the puzzle: 3102")] * 2)
    B, L = clean.shape
    valid = torch.ones(B, L, dtype=torch.long)
    valid[1, :2] = 0
    clean[1, :2] = w.pad_token_id
    noisy = clean.clone()
    noisy[:, 3::3] = w.mask_token_id
    with torch.no_grad():
        got = w.denoise_logits(noisy, valid, clean)
        pos = (valid.cumsum(1) - 1).clamp_min(0) * valid
        want = w.module(
            torch.cat([noisy, clean], 1), attention_mask=_hand_bd3lm(valid, 4), position_ids=torch.cat([pos, pos], 1)
        ).logits[:, :L]
        hidden = w.denoise_hidden(noisy, valid, clean)
    real = valid.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.module.get_output_embeddings()(hidden), got, rtol=1e-5, atol=1e-5)
    # fused CE path of the core (logits-free) gives the same token log-probs
    lp = w.token_logprobs(noisy, clean, valid, clean_ids=clean)
    w.fused_ce = True
    try:
        assert w.supports_fused_ce()
        lp_fused = w.token_logprobs(noisy, clean, valid, clean_ids=clean)
    finally:
        w.fused_ce = False
    torch.testing.assert_close(lp_fused[real], lp[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_block_generation_cache_equals_no_cache(which, w, moe_ckpt):
    wr = w if which == "dense" else load(moe_ckpt)
    prompts = [
        wr.encode(wr.render_prompt([{"role": "user", "content": t}]))
        for t in ("Solve the puzzle: 3102", "hi", "hello world 1234 5")
    ]
    pid, pmask = left_pad(prompts, wr.pad_token_id)
    outs = []
    for cache in (True, False):
        cfg = BlockRolloutConfig(gen_length=12, steps=4, temperature=0.0, use_cache=cache, stop_at_stop_token=False)
        outs.append(BlockSampler(cfg).generate(wr, pid, pmask, record=frozenset({"reveal_step"})))
    assert torch.equal(outs[0].response_ids, outs[1].response_ids)
    assert torch.equal(outs[0].reveal_step, outs[1].reveal_step)
    assert not (outs[0].response_ids == wr.mask_token_id).any()


def test_moe_checkpoint_loads(moe_ckpt):
    from transformers import AutoModelForCausalLM

    from dare_plugin_sdar.modeling_sdar_moe import SDARMoeForCausalLM

    wr = load(moe_ckpt)
    assert isinstance(wr.module, SDARMoeForCausalLM) and wr.block_size == 4
    # like the published MoE config: no block_size / mask_token_id; 4 and the tokenizer's mask are used
    cfg = json.load(open(f"{moe_ckpt}/config.json"))
    assert cfg.get("block_size") is None and cfg.get("mask_token_id") is None
    assert wr.mask_token_id == wr.tokenizer.convert_tokens_to_ids("<|MASK|>")
    assert type(AutoModelForCausalLM.from_pretrained(moe_ckpt)) is SDARMoeForCausalLM


def test_dare_generate_cli(ckpt, monkeypatch):
    from dare_core import cli as cli_mod
    from dare_core.testing.registries import build_for

    dare = build_for(dare_plugin_sdar)
    monkeypatch.setattr(cli_mod, "_dare", lambda: dare)
    result = CliRunner().invoke(
        cli_mod.cli,
        ["generate", "--model", "sdar", "--prompt", "Solve 1 + 2", f"model.path={ckpt}", "rollout.gen_length=8"],
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("---")


class TestSDARContract(ModelFamilyContract):
    family = "sdar"
    plugins = (dare_plugin_sdar,)
    create_kwargs = SIZES
