"""The bundled tiny checkpoint: published layout, preset, `dare generate`, a short SFT run."""

import os

import pytest

import dare_plugin_llada2
import dare_plugin_sft
from dare_core.api import TaskConfig
from dare_core.config import resolve
from dare_core.testing.registries import build_for
from dare_core.train import train
from dare_nn.testing import bundled
from dare_plugin_llada2.wrapper import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_llada2, dare_plugin_sft)


def test_layout_and_published_names():
    from transformers import AutoModelForCausalLM

    from dare_plugin_llada2.hf import register_auto_classes

    register_auto_classes()

    cfg = bundled.checkpoint_config(
        BUNDLED, ["config.json", "tokenizer.json", "dare_defaults.yaml"], "llada2_moe", "LLaDA2MoeModelLM"
    )
    assert cfg["num_experts"] == 4 and cfg["n_group"] == 2 and cfg["first_k_dense_replace"] == 1
    bundled.assert_token_names(BUNDLED, {cfg["mask_token_id"]: "<|mask|>"})
    model = AutoModelForCausalLM.from_pretrained(BUNDLED)
    names = set(model.state_dict())
    assert {
        "model.word_embeddings.weight",
        "lm_head.weight",
        "model.layers.1.mlp.gate.expert_bias",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.shared_experts.down_proj.weight",
    } <= names


def test_preset_applies(dare):
    cfg = resolve(dare, algo="sft", model="llada2")
    assert cfg.model.path == BUNDLED and cfg.task.name == "sudoku"
    assert cfg.rollout.gen_length == 40


def test_generate_cli(dare, dare_cli):
    sudoku = dare.registries.tasks.get("sudoku").build(TaskConfig(name="sudoku"))
    assert "<answer>" in bundled.generate_answer(dare_cli(dare), "llada2", sudoku)


def test_short_sft_run(dare, tmp_path):
    common = [
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
    train(dare, resolve(dare, algo="sft", model="llada2", overrides=common))
    assert os.path.isfile(tmp_path / "sft" / "final" / "config.json")
    assert os.path.isfile(tmp_path / "sft" / "final" / "dare_defaults.yaml")
