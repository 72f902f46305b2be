"""Sharded loading on 2 gloo ranks: every bundled family, built on the meta device and filled
from its safetensors shard by shard, holds exactly the checkpoint (tied weights and computed
buffers included) and takes the same first step as the whole model sharded; on a model large
enough to show it, a rank's private memory never holds more than its shard and a transient, to
load or to export it."""

from __future__ import annotations

import importlib.util

import pytest
from sharded_load_runs import FAMILIES, load_peak, loaded_shards, shared_layers_refusal

from dare_core.testing.distributed import run_ranks

INSTALLED = tuple(f for f in FAMILIES if importlib.util.find_spec(f"dare_plugin_{f}") is not None)


@pytest.fixture(scope="module")
def shards():
    if not INSTALLED:
        pytest.skip("no family plugin installed")
    return run_ranks(2, loaded_shards, INSTALLED)[0]


@pytest.mark.parametrize("family", INSTALLED)
def test_shards_equal_the_checkpoint(shards, family):
    facts = shards[family]
    assert facts["meta"], "the fsdp engine loads a full safetensors checkpoint on the meta device"
    assert facts["diff"] == 0.0
    assert facts["reference"] == 0.0  # built sharded from the loaded policy


@pytest.mark.parametrize("family", INSTALLED)
def test_first_step_equals_the_whole_model_sharded(shards, family):
    assert shards[family]["step"] < 1e-6


@pytest.mark.skipif("llada" not in INSTALLED, reason="needs dare-plugin-llada")
def test_a_rank_never_holds_the_whole_model_to_load_or_export(tmp_path):
    from dare_plugin_llada.wrapper import create

    path = tmp_path / "llada-28m"  # 28M parameters: 110 MB in fp32
    create(str(path), ["Solve 1 + 2 = 3.", "hello world"] * 20, d_model=512, n_layers=8, mlp_hidden_size=1536)
    model_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    ranks = run_ranks(2, load_peak, str(path), "fsdp", str(tmp_path))
    assert all(abs(2 * r["parameters"] - model_bytes) < 0.01 * model_bytes for r in ranks)
    assert max(r["peak"] for r in ranks) <= 0.6 * model_bytes, (model_bytes, ranks)
    # exporting, a rank holds the bytes of its part of each output file once more (DCP's
    # safetensors writer); gathered to one rank, the export held the whole model there
    assert max(r["export"] for r in ranks) <= 0.75 * model_bytes, (model_bytes, ranks)


@pytest.mark.skipif(importlib.util.find_spec("dare_plugin_diffusiongemma") is None, reason="needs diffusiongemma")
def test_layers_shared_with_another_unit_are_refused():
    message = run_ranks(2, shared_layers_refusal)[0]
    assert "cannot shard it" in message and "\n" not in message
