"""``dare init`` (registered by dare-nn): a family's ``create`` receives the task texts and the
size overrides; bad input is one line before anything is written."""

import dare_nn.plugin
import dare_plugin_tasks
from dare_core.api import ModelFamily, hookimpl
from dare_core.testing.registries import build_for

CREATED: list = []


class _Family:
    @hookimpl
    def dare_register_model_wrappers(self, register):
        def create(out, texts, **sizes):
            CREATED.append((out, texts, sizes))

        register(ModelFamily(name="maker", kind="masked", load=lambda *a, **k: None, create=create))
        register(ModelFamily(name="fixed", kind="masked", load=lambda *a, **k: None))


def test_init_trains_on_task_texts_with_size_overrides(dare_cli, tmp_path):
    CREATED.clear()
    run = dare_cli(build_for(dare_nn.plugin, dare_plugin_tasks, _Family()))
    out = tmp_path / "new"
    result = run("init", "--model", "maker", "--out", str(out), "--task", "countdown", "d_model=64")
    assert result.exit_code == 0, result.output
    ((path, texts, sizes),) = CREATED
    assert path == str(out) and sizes == {"d_model": 64}
    from dare_plugin_tasks.countdown import COUNTDOWN_PROMPT

    head = COUNTDOWN_PROMPT.split("{")[0]
    assert texts and any(t.startswith(head) for t in texts) and any("<answer>" in t for t in texts)


def test_init_refuses_bad_input_in_one_line(dare_cli, tmp_path):
    run = dare_cli(build_for(dare_nn.plugin, dare_plugin_tasks, _Family()))
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    for args, words in (
        (["--model", "fixed", "--out", str(tmp_path / "a")], "cannot create"),
        (["--model", "maker", "--out", str(full)], "not empty"),
        (["--model", "maker", "--out", str(tmp_path / "b"), "novalue"], "key=value"),
    ):
        result = run("init", *args)
        assert result.exit_code == 2 and words in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_init_writes_the_weights_in_the_dtype_asked_for(dare_cli, tmp_path):
    """``--dtype bfloat16``: the floating-point tensors stored in bf16 (integer ones kept) and
    ``config.json`` saying so, as published checkpoints are."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    class _Writer:
        @hookimpl
        def dare_register_model_wrappers(self, register):
            def create(out, texts, **sizes):
                save_file({"w": torch.randn(3, 2), "ids": torch.arange(3)}, f"{out}/model.safetensors")
                (tmp_path / "bf16" / "config.json").write_text(json.dumps({"dtype": "float32"}))

            register(ModelFamily(name="writer", kind="masked", load=lambda *a, **k: None, create=create))

    (tmp_path / "bf16").mkdir()
    run = dare_cli(build_for(dare_nn.plugin, dare_plugin_tasks, _Writer()))
    result = run("init", "--model", "writer", "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    tensors = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert tensors["w"].dtype == torch.bfloat16 and tensors["ids"].dtype == torch.int64
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
