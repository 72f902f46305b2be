"""Shared fixtures: a tiny randomly initialised LLaDA2 checkpoint made by the family's ``create``."""

from __future__ import annotations

import pytest

from dare_nn.testing.bundled import make_tiny_checkpoint

TEXTS = ["Solve 1 + 2 = 3.", "<answer>\n3142\n</answer>", "hello world"] * 20


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """Directory of a tiny 2-layer LLaDA2-MoE checkpoint (block size 4), one per test module."""
    from dare_plugin_llada2.wrapper import create

    return make_tiny_checkpoint(
        tmp_path_factory,
        create,
        "l2",
        TEXTS,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=48,
        moe_intermediate_size=16,
        vocab_size=300,
        block_size=4,
    )
