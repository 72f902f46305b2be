"""The bundled tiny DiffusionGemma checkpoint: published layout, preset, ``dare generate``, and
one-step SFT and RL runs."""

import os

import pytest

import dare_plugin_sft
from dare_core.api import TaskConfig
from dare_core.config import resolve
from dare_core.train import train
from dare_nn.testing import bundled
from dare_plugin_diffusiongemma.config import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")

COMMON = [
    "task.num_eval=2",
    "eval.batch_size=2",
    "trainer.steps=1",
    "progress=false",
    "trainer.batch_size=2",
    "trainer.micro_batch_size=2",
    "eval.before=false",
    "rollout.max_denoising_steps=2",
]


@pytest.fixture(scope="module")
def dare(registries):
    import dare_plugin_coupled_grpo
    import dare_plugin_reinforce_rloo

    return registries(dare_plugin_sft, dare_plugin_reinforce_rloo, dare_plugin_coupled_grpo)


def test_layout_and_published_names():
    cfg = bundled.checkpoint_config(
        BUNDLED,
        ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "dare_defaults.yaml"],
        "diffusion_gemma",
        "DiffusionGemmaForBlockDiffusion",
    )
    assert cfg["text_config"]["model_type"] == "diffusion_gemma_text" and cfg["canvas_length"] == 8
    names = bundled.safetensors_names(BUNDLED)
    assert {
        "model.decoder.embed_tokens.weight",
        "model.decoder.self_conditioning.gate_proj.weight",
        "model.decoder.layers.0.experts.gate_up_proj",
        "model.decoder.layers.0.router.proj.weight",
    } <= names
    bundled.assert_token_names(BUNDLED, {0: "<pad>", 1: "<eos>", 2: "<bos>", 5: "<|turn>", 6: "<turn|>"})
    assert os.path.getsize(os.path.join(BUNDLED, "model.safetensors")) < 2_000_000


def test_preset_applies_below_overrides(dare):
    cfg = resolve(dare, algo="sft", model="diffusiongemma")
    assert cfg.model.path == BUNDLED and cfg.task.name == "sudoku" and cfg.rollout_backend == "entropy_bound"
    assert cfg.rollout.gen_length == 40 and cfg.eval.temperature == 1.0
    assert resolve(dare, algo="sft", model="diffusiongemma", overrides=["trainer.lr=1e-6"]).trainer.lr == 1e-6
    rl = resolve(dare, algo="reinforce_rloo", model="diffusiongemma")
    assert (rl.trainer.batch_size, rl.trainer.group_size, rl.algorithm.mc_num, rl.rollout.temperature) == (
        16,
        8,
        4,
        1.0,
    )


def test_generate_answers_in_the_trained_format(dare, dare_cli):
    sudoku = dare.registries.tasks.get("sudoku").build(TaskConfig(name="sudoku"))
    output = bundled.generate_answer(dare_cli(dare), "diffusiongemma", sudoku)
    assert "<answer>" in output and "</answer>" in output


@pytest.mark.parametrize("algo", ["sft", "reinforce_rloo", "coupled_grpo"])
def test_one_step_runs(dare, tmp_path, algo):
    extra = ["trainer.group_size=2"] if algo != "sft" else []
    summary = train(
        dare,
        resolve(
            dare,
            algo=algo,
            model="diffusiongemma",
            overrides=COMMON + extra + [f"output_dir={tmp_path}", f"run_name={algo}"],
        ),
    )
    assert "after" in summary["eval"]
    assert os.path.isfile(tmp_path / algo / "final" / "model.safetensors")
    assert os.path.isfile(tmp_path / algo / "final" / "generation_config.json")
