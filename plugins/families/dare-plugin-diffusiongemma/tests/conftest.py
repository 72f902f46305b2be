"""Shared fixtures: a tiny randomly initialised DiffusionGemma checkpoint made by the family's
``create`` (2 layers: sliding window 8, then full attention; canvases of 4 tokens) and registries
of this plugin with the plugins its tests drive."""

from __future__ import annotations

import pytest
import torch

import dare_plugin_diffusiongemma
import dare_plugin_samplers
import dare_plugin_tasks
from dare_core.testing.registries import build_for
from dare_nn.testing.bundled import make_tiny_checkpoint

TEXTS = ["Solve 1 + 2 = 3.", "<answer>\n3142\n</answer>", "hello world"] * 20
SIZES = dict(num_hidden_layers=2, sliding_window=8, canvas_length=4, vocab_size=300, max_denoising_steps=6)


@pytest.fixture(scope="session")
def registries():
    """``registries(*plugins)``: this plugin, the samplers and tasks it requires, and ``plugins``."""
    return lambda *plugins: build_for(dare_plugin_diffusiongemma, dare_plugin_samplers, dare_plugin_tasks, *plugins)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from dare_plugin_diffusiongemma.wrapper import create

    return make_tiny_checkpoint(tmp_path_factory, create, "dg", TEXTS, **SIZES)


@pytest.fixture(scope="session")
def wrapper(tiny_dir):
    from dare_plugin_diffusiongemma.wrapper import load

    return load(tiny_dir, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def prompts(wrapper):
    """Two left-padded chat prompts ``(ids [2, P], mask)``, the second longer than the sliding window."""
    from dare_core.api import left_pad

    texts = ("a", "a longer prompt, longer than the sliding window")
    return left_pad(
        [wrapper.encode(wrapper.render_prompt([{"role": "user", "content": t}])) for t in texts], wrapper.pad_token_id
    )
