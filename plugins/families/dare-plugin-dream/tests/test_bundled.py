"""The bundled tiny checkpoint: layout and published names, preset, generation, short SFT and d1
runs (the algorithm plugins are used when installed)."""

import os

import pytest

import dare_plugin_dream
from dare_core.config import resolve
from dare_core.testing.registries import build_for
from dare_nn.testing import bundled
from dare_plugin_dream.wrapper import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="no bundled checkpoint")


def _algorithm_plugins():
    mods = []
    for name in ("dare_plugin_sft", "dare_plugin_d1"):
        try:
            mods.append(__import__(name))
        except ImportError:
            pass
    return mods


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_dream, *_algorithm_plugins())


def test_layout_and_published_names():
    from transformers import AutoModel

    from dare_plugin_dream.hf import register_auto_classes

    register_auto_classes()

    cfg = bundled.checkpoint_config(
        BUNDLED, ["config.json", "model.safetensors", "tokenizer.json", "dare_defaults.yaml"], "Dream", "DreamModel"
    )
    assert cfg["tie_word_embeddings"] is False
    bundled.assert_weight_names(
        BUNDLED,
        12 * cfg["num_hidden_layers"] + 3,
        [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
            "model.layers.0.self_attn.q_proj.bias",
            "model.layers.0.mlp.gate_proj.weight",
        ],
    )
    bundled.assert_token_names(BUNDLED, {cfg["mask_token_id"]: "<|mask|>", cfg["eos_token_id"]: "<|endoftext|>"})
    assert type(AutoModel.from_pretrained(BUNDLED)).__name__ == "DreamModel"


def test_preset_applies(dare):
    if "sft" not in dare.registries.algorithms:
        pytest.skip("dare-plugin-sft not installed")
    cfg = resolve(dare, algo="sft", model="dream")
    assert cfg.model.path == BUNDLED and cfg.rollout_backend == "dream_generate"
    assert cfg.task.name == "sudoku" and cfg.rollout.gen_length == 40 and cfg.rollout.steps == 40
    assert resolve(dare, algo="sft", model="dream", overrides=["rollout.steps=20"]).rollout.steps == 20


def test_greedy_generation_answers_in_the_trained_format(dare):
    from dare_core.config import TaskConfig
    from dare_core.workflows.batching import left_pad
    from dare_plugin_dream.sampler import DreamSampler, DreamSamplerConfig
    from dare_plugin_tasks.sudoku import SudokuTask

    wrapper = dare.registries.models.get("dream").load(BUNDLED)
    examples = SudokuTask(TaskConfig()).examples("eval", limit=4)
    ids, mask = left_pad([wrapper.encode(wrapper.render_prompt(e.prompt)) for e in examples], wrapper.pad_token_id)
    out = DreamSampler(DreamSamplerConfig(gen_length=40, steps=20, temperature=0.0)).generate(wrapper, ids, mask)
    texts = [wrapper.decode(r.tolist()) for r in out.response_ids]
    assert all("<answer>" in t and "</answer>" in t for t in texts), texts


def test_short_sft_and_d1_runs(dare, tmp_path):
    from dare_core.train import train

    common = [
        "task.num_eval=4",
        "eval.batch_size=4",
        "trainer.steps=1",
        "progress=false",
        f"output_dir={tmp_path}",
        "trainer.batch_size=2",
        "eval.before=false",
    ]
    ran = 0
    if "sft" in dare.registries.algorithms:
        train(dare, resolve(dare, algo="sft", model="dream", overrides=common + ["run_name=sft"]))
        assert os.path.isfile(tmp_path / "sft" / "final" / "model.safetensors")
        assert os.path.isfile(tmp_path / "sft" / "final" / "dare_defaults.yaml")
        ran += 1
    if "d1" in dare.registries.algorithms:
        s = train(
            dare, resolve(dare, algo="d1", model="dream", overrides=common + ["run_name=d1", "trainer.group_size=2"])
        )
        assert "after" in s["eval"]
        ran += 1
    if not ran:
        pytest.skip("no algorithm plugin installed")
