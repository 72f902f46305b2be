"""Shared fixtures: a tiny randomly initialised Dream checkpoint made by the family's ``create``."""

from __future__ import annotations

import math

import pytest
import torch

from dare_nn.testing.bundled import make_tiny_checkpoint

TEXTS = ["Solve the sudoku 1 0 3 0 / 0 4 0 2.", "<answer>\n3142\n</answer>", "hello world, 12 + 30 = 42"] * 20


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    from dare_plugin_dream.wrapper import create

    return make_tiny_checkpoint(
        tmp_path_factory,
        create,
        "dream",
        TEXTS,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=300,
    )


@pytest.fixture(scope="session")
def wrapper(tiny_ckpt):
    """The tiny model with weights scaled up so that logits (and generations) are far from uniform."""
    from dare_plugin_dream.wrapper import load

    w = load(tiny_ckpt)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in w.module.named_parameters():
            if name.endswith("norm.weight"):
                continue
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]) * 1.5)
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    w.module.eval()
    return w
