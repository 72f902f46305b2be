"""The bundled tiny checkpoint: layout, preset, generation, a short d1 and SFT run, and (slow)
the quick-start learning run of the README."""

import json
import os

import pytest
import torch

import dare_plugin_d1
import dare_plugin_llada
import dare_plugin_sft
from dare_core.api import TaskConfig
from dare_core.config import resolve
from dare_core.testing.registries import build_for
from dare_core.train import train
from dare_nn.testing import bundled
from dare_plugin_llada.wrapper import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_llada, dare_plugin_sft, dare_plugin_d1)


def test_layout_and_published_names():
    from transformers import AutoModel

    from dare_plugin_llada.hf import register_auto_classes

    register_auto_classes()

    cfg = bundled.checkpoint_config(
        BUNDLED, ["config.json", "model.safetensors", "tokenizer.json", "dare_defaults.yaml"], "llada", "LLaDAModelLM"
    )
    bundled.assert_weight_names(
        BUNDLED,
        9 * cfg["n_layers"] + 3,
        [
            "model.transformer.wte.weight",
            "model.transformer.ln_f.weight",
            "model.transformer.ff_out.weight",
            "model.transformer.blocks.0.ff_proj.weight",
            "model.transformer.blocks.0.attn_out.weight",
        ],
    )
    bundled.assert_token_names(BUNDLED, {cfg["mask_token_id"]: "<|mdm_mask|>"})
    assert type(AutoModel.from_pretrained(BUNDLED)).__name__ == "LLaDAModelLM"


def test_preset_applies_below_overrides(dare):
    cfg = resolve(dare, algo="d1", model="llada")
    assert cfg.model.path == BUNDLED
    assert cfg.task.name == "sudoku" and cfg.task.num_eval >= 200
    assert cfg.rollout.gen_length == 40
    assert cfg.trainer.lr != 5e-7  # the preset beats the 8B recipe
    cfg2 = resolve(dare, algo="d1", model="llada", overrides=["trainer.lr=1e-6"])
    assert cfg2.trainer.lr == 1e-6


def test_generate_solves_a_training_style_puzzle(dare, dare_cli):
    sudoku = dare.registries.tasks.get("sudoku").build(TaskConfig(name="sudoku"))
    output = bundled.generate_answer(dare_cli(dare), "llada", sudoku)
    assert "<answer>" in output and "</answer>" in output


def test_short_d1_and_sft_runs(dare, tmp_path):
    common = [
        "task.num_eval=8",
        "eval.batch_size=8",
        "trainer.steps=1",
        "progress=false",
        f"output_dir={tmp_path}",
        "trainer.batch_size=2",
        "trainer.group_size=2",
    ]
    s = train(dare, resolve(dare, algo="d1", model="llada", overrides=common + ["run_name=d1"]))
    assert {"before", "after"} <= set(s["eval"])
    metrics = [json.loads(l) for l in open(tmp_path / "d1" / "metrics.jsonl")]
    assert metrics[1]["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    # the trained model keeps the run presets of the checkpoint it started from
    assert os.path.isfile(tmp_path / "d1" / "final" / "dare_defaults.yaml")
    s = train(dare, resolve(dare, algo="sft", model="llada", overrides=common + ["run_name=sft", "eval.before=false"]))
    assert os.path.isfile(tmp_path / "sft" / "final" / "model.safetensors")


@pytest.mark.slow
def test_quick_start_d1_run_improves_heldout_accuracy(dare, tmp_path):
    """`dare train --algo d1 --model llada` with no other argument (the README's numbers)."""
    torch.set_num_threads(2)
    summary = train(dare, resolve(dare, algo="d1", model="llada", overrides=[f"output_dir={tmp_path}"]))
    before, after = summary["eval"]["before"], summary["eval"]["after"]
    assert before["n"] >= 200
    assert after["accuracy"] > before["accuracy"], (before, after)  # seed 0: 0.320 -> 0.340
