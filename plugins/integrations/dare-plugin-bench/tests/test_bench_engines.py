"""``dare bench engines``: one end-to-end run with tiny settings on the bundled LLaDA checkpoint
(processes started like torchrun: gloo ranks on the CPU, one thread each), the summary of the
step records, and one-line errors."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from dare_core.api import get_dare
from dare_plugin_bench.cli import bench
from dare_plugin_bench.engines import _memory_engines, _scaling_summary

TINY = ["--steps", "2", "--batch", "1", "--group-size", "2", "--gen-length", "8", "--repeats", "1"]
HAVE_FSDP = importlib.util.find_spec("dare_plugin_fsdp") is not None


@pytest.fixture(scope="module")
def tiny_run():
    """``dare bench engines`` with both parts: ddp on 1 and 2 processes; single and fsdp memory."""
    engines = "single,fsdp" if HAVE_FSDP else "single"
    res = CliRunner().invoke(bench, ["engines", *TINY, "--engines", engines], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def _json_tail(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_runs_end_to_end_and_ends_with_one_json_line(tiny_run):
    data = _json_tail(tiny_run)
    assert data["bench"] == "engines" and data["model"]["family"] == "llada"
    assert data["setup"]["procs"] == 2 and data["setup"]["threads_per_process"] == 1
    runs = data["scaling"]["runs"]
    assert runs["1"]["tokens_per_step"] == 1 * 2 * 8 and runs["2"]["tokens_per_step"] == 2 * 2 * 8
    for r in runs.values():
        assert r["tokens_per_s"] > 0 and len(r["step_s_each"]) == 1 and len(r["step_s_each"][0]) == 2
    assert data["ratios"]["weak_scaling_ideal"] == 2.0
    assert data["ratios"]["weak_scaling"] == pytest.approx(
        runs["2"]["tokens_per_s"] / runs["1"]["tokens_per_s"], rel=1e-2
    )
    assert "--nproc_per_node=2 -m dare_core train --algo d1 --model llada" in data["scaling"]["command"]
    single = data["memory"]["single"]
    assert single["ranks"] == 1 and single["parameters"] > 0
    assert single["gradients"] == single["parameters"]  # fp32 gradients of every parameter
    assert single["optimizer"] >= 2 * single["parameters"]  # AdamW: two moments per parameter
    assert "weak scaling:" in tiny_run and "total MiB / rank" in tiny_run


@pytest.mark.skipif(not HAVE_FSDP, reason="dare-plugin-fsdp is not installed")
def test_fsdp_holds_about_half_the_parameters_per_rank_on_two_ranks(tiny_run):
    data = _json_tail(tiny_run)
    single, fsdp = data["memory"]["single"], data["memory"]["fsdp"]
    assert fsdp["ranks"] == 2 and "error" not in fsdp
    assert fsdp["parameters"] < 0.75 * single["parameters"]
    assert fsdp["optimizer"] < 0.75 * single["optimizer"]
    assert data["ratios"]["memory_per_rank"]["fsdp"]["parameters"] < 0.75
    assert fsdp["load_peak_max_rank"] > 0 and data["ratios"]["load_peak_vs_model"]["fsdp"] > 0
    assert "load peak vs model" in tiny_run


def test_summary_drops_each_runs_first_step():
    def rec(step, seconds):
        return {"step": step, "time_rollout": seconds, "time_logprob": 0.0, "time_update": 0.0, "response_length": 8.0}

    runs = [[rec(1, 9.0), rec(2, 1.0), rec(3, 2.0)], [rec(1, 9.0), rec(2, 3.0)]]
    s = _scaling_summary(2, runs, rows_per_proc=4, gen_length=8)
    assert s["step_s"] == 2.0 and s["rows_per_step"] == 8 and s["tokens_per_step"] == 64
    assert s["tokens_per_s"] == 32.0 and s["step_s_each"] == [[9.0, 1.0, 2.0], [9.0, 3.0]]


def test_memory_engines_always_start_with_single():
    dare = get_dare()
    assert _memory_engines(dare, "fsdp,single,fsdp")[0] == "single"
    auto = _memory_engines(dare, "auto")
    assert auto[0] == "single" and set(auto[1:]) <= {"fsdp", "deepspeed"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "1"], "--steps must be >= 2"),
        (["--procs", "1"], "--procs must be >= 2"),
        (["--engines", "nope"], "--engines: unknown engine 'nope'"),
        (["--engine", "single"], "--engine single runs one process"),
        (["--gen-length", "10", "--block-length", "4"], "multiple of --block-length"),
        (["-o", "trainer.lr=-1"], "trainer.lr"),
        (["--algo", "nope"], "nope"),
    ],
)
def test_bad_options_are_one_line_errors(dare_cli, args, message):
    res = dare_cli(get_dare())("bench", "engines", *args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.output
