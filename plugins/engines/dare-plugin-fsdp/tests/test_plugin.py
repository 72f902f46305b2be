"""The plugin's registration (entry point, ``dare list engines``), its ``fsdp:`` config
section, and the one-line errors before any process group is joined."""

from __future__ import annotations

import importlib.metadata as md

import attrs
import pytest

import dare_plugin_fsdp.plugin as fsdp_plugin
from dare_core.api import DareError
from dare_core.config import resolve
from dare_core.errors import ConfigError
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_plugin_fsdp.config import FSDPConfig
from dare_plugin_fsdp.engine import build_fsdp


@pytest.fixture
def dare(dare_build):
    return dare_build(toy, DigitsPlugin(), fsdp_plugin)


@pytest.fixture
def no_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


def _config(dare, tmp_path, *overrides):
    return resolve(
        dare,
        algo="sup_test",
        model="toy",
        overrides=[f"model.path={tmp_path}", f"output_dir={tmp_path / 'runs'}", "model.device=cpu", *overrides],
    )


def test_the_distribution_registers_the_plugin_module_as_entry_point_fsdp():
    (ep,) = [e for e in md.entry_points(group="dare") if e.name == "fsdp"]
    assert ep.value == "dare_plugin_fsdp.plugin" and ep.dist.name == "dare-plugin-fsdp"


def test_dare_list_engines_shows_fsdp_with_its_launcher(dare, dare_cli):
    result = dare_cli(dare)("list", "engines")
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if line.split()[:1] == ["fsdp"]]
    assert "torchrun" in row and "dare_plugin_fsdp" in row
    assert dare.registries.engines.get("fsdp").distributed


def test_every_field_has_help_and_the_section_is_frozen():
    for f in attrs.fields(FSDPConfig):
        assert f.metadata.get("help"), f.name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        FSDPConfig().cpu_offload = True


def test_the_section_defaults_and_overrides(dare, tmp_path):
    assert _config(dare, tmp_path).plugin_section("fsdp") == FSDPConfig(
        reshard_after_forward=True, cpu_offload=False, reduce_dtype="fp32"
    )
    cfg = _config(dare, tmp_path, "fsdp.reshard_after_forward=false", "fsdp.reduce_dtype=bf16")
    assert cfg.plugin_section("fsdp", FSDPConfig) == FSDPConfig(reshard_after_forward=False, reduce_dtype="bf16")
    with pytest.raises(ConfigError) as info:
        _config(dare, tmp_path, "fsdp.reduce_dtype=fp16")
    assert "reduce_dtype" in str(info.value) and "\n" not in str(info.value)


def test_training_without_a_launcher_is_a_one_line_error(dare, dare_cli, tmp_path, no_launcher):
    result = dare_cli(dare)(
        "train",
        "--algo",
        "sup_test",
        "--model",
        "toy",
        f"model.path={tmp_path}",
        f"output_dir={tmp_path / 'runs'}",
        "model.device=cpu",
        "engine.name=fsdp",
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: engine.name=fsdp") and "torchrun --nproc_per_node" in line
    assert not (tmp_path / "runs").exists()


def test_stochastic_rounding_of_pure_bf16_is_refused(dare, tmp_path, no_launcher):
    cfg = _config(dare, tmp_path, "engine.name=fsdp", "engine.precision=bf16", "engine.bf16_update=stochastic")
    with pytest.raises(DareError, match="bf16_update=kahan"):
        build_fsdp(cfg)


def test_loading_state_another_engine_wrote_is_a_one_line_error(tmp_path):
    from dare_plugin_fsdp.engine import FSDPEngine

    (tmp_path / "engine_state.pt").write_bytes(b"")
    engine = FSDPEngine.__new__(FSDPEngine)  # the check comes before any collective
    with pytest.raises(DareError, match=r"not written by engine.name=fsdp") as info:
        engine.load_state(str(tmp_path))
    assert "\n" not in str(info.value)
