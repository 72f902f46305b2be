"""Helpers for the tests of a family plugin's checkpoints: the bundled tiny checkpoint's files and
published names, ``dare generate`` answering a task's prompt through the CLI, and fresh tiny
checkpoints made by the family's ``create``."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable


def checkpoint_config(path: str, files: Iterable[str], model_type: str, architecture: str) -> dict:
    """The checkpoint's config.json after checking that ``files`` are all in ``path`` and that
    it names ``model_type`` and the single architecture ``architecture``."""
    assert set(files) <= set(os.listdir(path))
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["model_type"] == model_type and cfg["architectures"] == [architecture]
    return cfg


def safetensors_names(path: str) -> set[str]:
    """Tensor names stored in ``path/model.safetensors``."""
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), "pt") as fh:
        return set(fh.keys())


def assert_weight_names(path: str, count: int, required: Iterable[str]) -> None:
    """``path/model.safetensors`` holds ``count`` tensors, among them every name of ``required``."""
    names = safetensors_names(path)
    assert len(names) == count
    assert set(required) <= names


def assert_token_names(path: str, expected: dict) -> None:
    """The checkpoint's tokenizer spells each id of ``expected`` (id -> token string) as given."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    for tid, token in expected.items():
        assert tok.convert_ids_to_tokens(tid) == token


def generate_answer(invoke: Any, model: str, task: Any) -> str:
    """Output of ``dare generate --model MODEL`` on the first evaluation prompt of ``task`` (a
    built task, e.g. the registered ``sudoku``), run through ``invoke`` (the testing kit's
    ``dare_cli(dare)``); asserts the command succeeded."""
    example = task.examples("eval", limit=1)[0]
    result = invoke("generate", "--model", model, "--prompt", example.prompt[0]["content"])
    assert result.exit_code == 0, result.output
    return result.output


def make_tiny_checkpoint(tmp_path_factory: Any, create: Any, name: str, texts: list[str], **sizes: Any) -> str:
    """Directory of a tiny checkpoint written by a family's ``create(out_dir, texts, **sizes)``
    with the global torch seed set to 0 first (the same weights every time)."""
    import torch

    out = str(tmp_path_factory.mktemp(name) / "tiny")
    torch.manual_seed(0)
    create(out, texts, **sizes)
    return out
