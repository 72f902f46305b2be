"""``dare bench rl --preset`` (several response lengths, ratios side by side) and the *cached*
side the benches add when the accelerated rollout runs static-shape steps (toy model, CPU)."""

from __future__ import annotations

import json

import pytest

import dare_plugin_bench
from dare_core.testing import toy
from dare_core.testing.registries import build_for
from dare_core.testing.toy import make_toy_wrapper

SMALL = ["--prompt-length", "6", "--block-length", "4", "--repeats", "1"]


@pytest.fixture
def run(dare_cli, tmp_path):
    dare = dare_cli(build_for(dare_plugin_bench, toy))
    ckpt = tmp_path / "toy-ckpt"
    make_toy_wrapper().save_pretrained(str(ckpt))
    return lambda *args: dare(*args, "--checkpoint", str(ckpt))


def _json_tail(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_rl_preset_runs_every_length_with_ratios_side_by_side(run, monkeypatch):
    from dare_plugin_bench import rl

    preset = dict(rl.PRESETS["paper-masked"], gen_lengths=(8, 16))
    monkeypatch.setitem(rl.PRESETS, "paper-masked", preset)
    res = run("bench", "rl", "--model", "toy", "--preset", "paper-masked", *SMALL)
    assert res.exit_code == 0, res.output
    data = _json_tail(res.output)
    assert data["preset"] == "paper-masked" and data["setup"]["gen_length"] == [8, 16]
    assert data["setup"]["group_size"] == 8 and data["setup"]["batch"] == 8
    assert set(data["ratios"]) == {"8", "16"}
    for part, gen_length in zip(data["lengths"], (8, 16)):
        assert part["gen_length"] == gen_length
        acc = part["configs"]["accelerated"]["config"]
        assert "cache=dual" in acc and "decoding=quota" in acc and f"steps={gen_length // 2}" in acc
        assert part["eager"]["nfe_per_step"] == gen_length // 2
        assert part["ratios"]["step_speedup"] > 0
    table = res.output.split("ratio")[1]
    assert "gen 8" in table and "gen 16" in table and "step_speedup" in table


def test_rl_preset_keeps_explicit_options(run):
    res = run(
        "bench",
        "rl",
        "--model",
        "toy",
        "--preset",
        "paper-masked",
        *SMALL,
        "--gen-length",
        "8",
        "--batch",
        "4",
        "--group-size",
        "2",
        "--steps",
        "8",
        "-a",
        "cache=prefix",
    )
    assert res.exit_code == 0, res.output
    data = _json_tail(res.output)
    assert data["setup"]["gen_length"] == 8 and data["setup"]["group_size"] == 2
    assert "cache=prefix" in data["configs"]["accelerated"]["config"]
    assert data["eager"]["nfe_per_step"] == 8


def test_rl_block_preset_refuses_a_masked_model(run):
    res = run("bench", "rl", "--model", "toy", "--preset", "paper-block", *SMALL)
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and "'block' does not support masked-diffusion models" in res.output, (
        res.output
    )


@pytest.mark.parametrize("command", ["rollout", "rl"])
def test_static_steps_add_a_cached_side(run, command):
    """-a graphs=static: baseline, cached (graphs=eager), accelerated, interleaved; the static side
    decodes what the cached side decodes."""
    extra = ["--group-size", "2"] if command == "rl" else []
    res = run(
        "bench",
        command,
        "--model",
        "toy",
        *SMALL,
        "--gen-length",
        "8",
        "--batch",
        "4",
        "-a",
        "graphs=static",
        "--warmup",
        "1",
        *extra,
    )
    assert res.exit_code == 0, res.output
    data = _json_tail(res.output)
    cached = data["configs"]["cached"]["config"]
    assert (cached["graphs"] if command == "rollout" else cached.split("graphs=")[1].split()[0]) == "eager"
    order = [ln.split("]")[1].split(":")[0].strip() for ln in res.output.splitlines() if ln.startswith("[")]
    assert order == ["baseline", "cached", "accelerated"]  # the warm-up runs are not reported
    assert data["setup"]["warmup"] == 1
    if command == "rollout":
        assert data["ratios"]["token_agreement_graphs"] == 1.0
        assert data["ratios"]["tokens_per_s_graphs"] > 0
    else:
        assert data["ratios"]["graphs_speedup"] > 0 and data["cached"]["nfe_per_step"] == 8


def test_auto_graphs_on_cpu_add_no_side(run):
    res = run("bench", "rollout", "--model", "toy", *SMALL, "--gen-length", "8", "--batch", "2")
    assert res.exit_code == 0, res.output
    assert "cached" not in _json_tail(res.output)["configs"]
