"""The bundled tiny SDAR checkpoint: published layout, preset, generation, a one-step SFT run."""

import os

import pytest

import dare_plugin_sdar
import dare_plugin_sft
from dare_core.api import TaskConfig
from dare_core.config import resolve
from dare_core.testing.registries import build_for
from dare_core.train import train
from dare_nn.testing import bundled
from dare_plugin_sdar.wrapper import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_sdar, dare_plugin_sft)


def test_layout_and_published_names():
    from transformers import AutoModel, AutoModelForCausalLM

    from dare_plugin_sdar.hf import register_auto_classes

    register_auto_classes()

    cfg = bundled.checkpoint_config(
        BUNDLED,
        ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "dare_defaults.yaml"],
        "sdar",
        "SDARForCausalLM",
    )
    assert cfg["block_size"] == 4 and cfg["head_dim"] == 16 and cfg["num_key_value_heads"] == 2
    bundled.assert_weight_names(
        BUNDLED,
        11 * cfg["num_hidden_layers"] + 3,
        [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
            "model.layers.0.self_attn.q_norm.weight",
            "model.layers.0.mlp.gate_proj.weight",
        ],
    )
    bundled.assert_token_names(BUNDLED, {cfg["mask_token_id"]: "<|MASK|>"})
    assert type(AutoModelForCausalLM.from_pretrained(BUNDLED)).__name__ == "SDARForCausalLM"
    assert type(AutoModel.from_pretrained(BUNDLED)).__name__ == "SDARModel"


def test_preset_applies_below_overrides(dare):
    cfg = resolve(dare, algo="sft", model="sdar")
    assert cfg.model.path == BUNDLED and cfg.task.name == "sudoku"
    assert cfg.rollout.gen_length == 40 and cfg.rollout_backend == "block"
    assert resolve(dare, algo="sft", model="sdar", overrides=["trainer.lr=1e-6"]).trainer.lr == 1e-6


def test_generate_answers_in_the_trained_format(dare, dare_cli):
    sudoku = dare.registries.tasks.get("sudoku").build(TaskConfig(name="sudoku"))
    output = bundled.generate_answer(dare_cli(dare), "sdar", sudoku)
    assert "<answer>" in output and "</answer>" in output


def test_one_step_sft_run(dare, tmp_path):
    overrides = [
        "task.num_eval=4",
        "eval.batch_size=4",
        "trainer.steps=1",
        "progress=false",
        f"output_dir={tmp_path}",
        "trainer.batch_size=2",
        "trainer.micro_batch_size=2",
        "run_name=sft",
        "eval.before=false",
    ]
    summary = train(dare, resolve(dare, algo="sft", model="sdar", overrides=overrides))
    assert "after" in summary["eval"]
    assert os.path.isfile(tmp_path / "sft" / "final" / "model.safetensors")
    assert os.path.isfile(tmp_path / "sft" / "final" / "dare_defaults.yaml")
