"""The HF-layout export on 2 gloo ranks, written from each rank's shards: it loads with the
family's ``load`` and holds exactly the weights gathered to one rank, in the storage dtype, under
the names and with the config the single-process export writes; a non-finite weight on one rank
is refused on every rank with nothing written."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from export_runs import exported, nonfinite_export, single_export
from sharded_load_runs import FAMILIES

from dare_core.testing.distributed import run_ranks

INSTALLED = tuple(f for f in FAMILIES if importlib.util.find_spec(f"dare_plugin_{f}") is not None)


@pytest.mark.parametrize("family", INSTALLED)
def test_the_export_equals_the_gathered_weights(family, tmp_path):
    dtype = "bfloat16" if family == "llada" else "float32"
    facts = run_ranks(2, exported, family, str(tmp_path / "export"), dtype)[0]
    single = single_export(family, str(tmp_path / "single"))
    assert facts["diff"] == 0.0
    assert facts["names"] == single["names"]
    assert [f for f in facts["files"] if "safetensors" in f] == ["model.safetensors"]  # as save_pretrained
    assert "sharded" not in facts["files"]
    assert facts["config"] == single["config"]


@pytest.mark.skipif("llada" not in INSTALLED, reason="needs dare-plugin-llada")
def test_a_larger_model_is_split_into_files_with_an_index(tmp_path):
    facts = run_ranks(2, exported, "llada", str(tmp_path / "export"), "float32", 400_000)[0]
    files = [f for f in facts["files"] if f.endswith(".safetensors")]
    assert facts["diff"] == 0.0 and len(files) > 2 and "model.safetensors.index.json" in facts["files"]
    assert all(f.startswith("model-") and f.endswith(f"-of-{len(files):05d}.safetensors") for f in files)


def test_files_hold_at_most_the_size_in_state_dict_order():
    from dare_plugin_fsdp import export

    state = {n: torch.zeros(size) for n, size in [("a", 10), ("b", 10), ("c", 30), ("d", 1)]}
    sizes = {"a": 1, "b": 1, "c": 2, "d": 3}
    saved = export.MAX_FILE_BYTES
    try:
        export.MAX_FILE_BYTES = 80  # bytes: fp32 a and b fill the first file, c and d one each
        assert export.file_index(state, torch.float32) == sizes
        assert export.file_index(state, torch.bfloat16) == {"a": 1, "b": 1, "c": 2, "d": 2}
    finally:
        export.MAX_FILE_BYTES = saved


@pytest.mark.skipif("llada" not in INSTALLED, reason="needs dare-plugin-llada")
def test_a_nonfinite_shard_is_refused_on_every_rank(tmp_path):
    message = run_ranks(2, nonfinite_export, str(tmp_path / "export"))[0]
    assert "is not finite" in message and message.endswith("files: []"), message
