"""SDAR and SDAR-MoE through packed BD3LM rows: per-token log-probs, the NELBO and every parameter's
gradient equal the padded path's (fp32, 1e-5), with the naive and the fused head; a one-step SFT
run with model.train_attention=packed trains on packed rows with the padded run's loss."""

from __future__ import annotations

import json
import os

import pytest
import torch

import dare_plugin_sdar
import dare_plugin_sft
from dare_core.api import SequenceBatch, configure_training_paths
from dare_core.testing.registries import build_for
from dare_nn.testing.equality import assert_packed_equals_padded, packed_sft_losses, ragged_batch
from dare_plugin_sdar import wrapper as sdar_wrapper
from dare_plugin_sdar.configuration_sdar import SDARConfig, SDARMoeConfig
from dare_plugin_sdar.modeling_sdar import SDARForCausalLM
from dare_plugin_sdar.modeling_sdar_moe import SDARMoeForCausalLM
from dare_plugin_sdar.wrapper import BUNDLED, SDARWrapper

V = 128
PACKABLE = sdar_wrapper.CAPABILITIES | {"packed_varlen"}
SIZES = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=2,
    intermediate_size=48,
    vocab_size=V,
    max_position_embeddings=256,
    eos_token_id=V - 2,
)
#: (prompt, response) per row: left-padded prompts, one-token responses, a row filling the width
LENGTHS = ((4, 12), (9, 3), (2, 20), (6, 7), (3, 1), (9, 20), (1, 1))


def _wrapper(moe: bool, attention: str, cross_entropy: str) -> SDARWrapper:
    torch.manual_seed(0)
    if moe:
        module = SDARMoeForCausalLM(
            SDARMoeConfig(**SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
        )
    else:
        module = SDARForCausalLM(SDARConfig(**SIZES, block_size=4, mask_token_id=V - 1))
    w = SDARWrapper(
        family="sdar",
        module=module,
        tokenizer=None,
        kind="block",
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
        capabilities=PACKABLE,
        block_size=4,
    )
    paths = configure_training_paths(w, attention, cross_entropy, "cpu")
    assert (paths.attention, paths.fused_ce) == (attention, cross_entropy == "fused")
    return w


def _batch() -> SequenceBatch:
    return ragged_batch(LENGTHS, V, pad=V - 2)


@pytest.mark.parametrize("moe", [False, True], ids=["sdar", "sdar_moe"])
@pytest.mark.parametrize("cross_entropy", ["naive", "fused"])
def test_packed_equals_padded(moe, cross_entropy):
    batch = _batch()
    assert_packed_equals_padded(_wrapper(moe, "padded", "naive"), _wrapper(moe, "packed", cross_entropy), batch)


@pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")
def test_one_step_sft_trains_on_packed_rows(tmp_path, monkeypatch):
    dare = build_for(dare_plugin_sdar, dare_plugin_sft)
    losses = packed_sft_losses(dare, "sdar", SDARWrapper, tmp_path, monkeypatch)
    assert losses["packed"] and losses["packed"] == pytest.approx(losses["padded"], rel=1e-5)


@pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")
def test_bench_measures_packed_against_padded(monkeypatch, capsys):
    bench = pytest.importorskip("dare_plugin_bench.train")
    monkeypatch.setattr(sdar_wrapper, "CAPABILITIES", PACKABLE)
    rc = bench.main(
        [
            "--part",
            "packing",
            "--model",
            "sdar",
            "--batch",
            "4",
            "--prompt-length",
            "16",
            "--min-response",
            "4",
            "--max-response",
            "40",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
        ],
        dare=build_for(dare_plugin_sdar),
    )
    assert rc == 0
    pk = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["packing"]
    rows, width = pk["packed_shape"]
    padded_rows, padded_width = pk["padded_input_shape"]
    assert padded_rows == 4 and padded_width > pk["padded_shape"][1]  # the [noisy | clean] layout
    assert rows < padded_rows and rows * width < padded_rows * padded_width
    assert "attention=packed" in pk["packed"]["path"]
    assert pk["loss_rel_diff"] < 1e-5 and pk["grad_rel_diff"] < 1e-5
