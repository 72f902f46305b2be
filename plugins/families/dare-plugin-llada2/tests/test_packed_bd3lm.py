"""LLaDA2-MoE through packed BD3LM rows: per-token log-probs, the NELBO and every parameter's
gradient equal LLaDA2's own padded layout (full and compact; fp32, 1e-5), with the naive and the
fused head; a one-step SFT run with model.train_attention=packed has the padded run's loss."""

from __future__ import annotations

import os

import pytest
import torch

import dare_plugin_llada2
import dare_plugin_sft
from dare_core.api import SequenceBatch, configure_training_paths
from dare_core.testing.registries import build_for
from dare_nn.testing.equality import assert_packed_equals_padded, packed_sft_losses, ragged_batch
from dare_plugin_llada2 import wrapper as llada2_wrapper
from dare_plugin_llada2.configuration_llada2_moe import LLaDA2MoeConfig
from dare_plugin_llada2.modeling_llada2_moe import LLaDA2MoeModelLM
from dare_plugin_llada2.wrapper import BUNDLED, LLaDA2Wrapper

V = 128
PACKABLE = llada2_wrapper.CAPABILITIES | {"packed_varlen"}
#: (prompt, response) per row: left-padded prompts, one-token responses, a row filling the width
LENGTHS = ((4, 12), (9, 3), (2, 20), (6, 7), (3, 1), (9, 20), (1, 1))


def _wrapper(attention: str, cross_entropy: str, compact: bool = True) -> LLaDA2Wrapper:
    torch.manual_seed(0)
    cfg = LLaDA2MoeConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rotary_dim=8,
        intermediate_size=48,
        num_experts=4,
        num_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        rope_theta=10000.0,
        max_position_embeddings=256,
        vocab_size=V,
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
    )
    w = LLaDA2Wrapper(
        family="llada2",
        module=LLaDA2MoeModelLM(cfg),
        tokenizer=None,
        kind="block",
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
        capabilities=PACKABLE,
        block_size=4,
    )
    w.compact_layout = compact
    paths = configure_training_paths(w, attention, cross_entropy, "cpu")
    assert (paths.attention, paths.fused_ce) == (attention, cross_entropy == "fused")
    return w


def _batch() -> SequenceBatch:
    return ragged_batch(LENGTHS, V, pad=V - 2)


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "full"])
@pytest.mark.parametrize("cross_entropy", ["naive", "fused"])
def test_packed_equals_padded(compact, cross_entropy):
    batch = _batch()
    padded, packed = _wrapper("padded", "naive", compact), _wrapper("packed", cross_entropy, compact)
    grads = assert_packed_equals_padded(padded, packed, batch)
    assert len(grads) > 10


def test_inference_logits_stay_block_causal_and_unpadded():
    w = _wrapper("padded", "naive")
    batch = _batch()
    mask = batch.attention_mask
    logits = w.logits(batch.input_ids, mask)
    for b in range(mask.shape[0]):
        own = batch.input_ids[b : b + 1][:, mask[b].bool()]
        torch.testing.assert_close(logits[b][mask[b].bool()], w.logits(own)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")
def test_one_step_sft_trains_on_packed_rows(tmp_path, monkeypatch):
    dare = build_for(dare_plugin_llada2, dare_plugin_sft)
    losses = packed_sft_losses(dare, "llada2", LLaDA2Wrapper, tmp_path, monkeypatch)
    assert losses["packed"] and losses["packed"] == pytest.approx(losses["padded"], rel=1e-5)
