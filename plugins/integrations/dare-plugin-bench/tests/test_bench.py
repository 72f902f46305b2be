"""``dare bench``: smoke runs on the family-free toy model (seconds) and one-line errors."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import dare_plugin_bench
from dare_core.testing import toy
from dare_core.testing.registries import build_for
from dare_core.testing.toy import make_toy_wrapper
from dare_plugin_bench.common import PeakMemory, interleave, random_prompts

SMALL = ["--prompt-length", "6", "--gen-length", "8", "--block-length", "4", "--batch", "4", "--repeats", "2"]


@pytest.fixture
def run(dare_cli, tmp_path):
    dare = dare_cli(build_for(dare_plugin_bench, toy))
    ckpt = tmp_path / "toy-ckpt"
    make_toy_wrapper().save_pretrained(str(ckpt))

    def invoke(*args, checkpoint=True):
        extra = ["--checkpoint", str(ckpt)] if checkpoint else []
        return dare(*args, *extra)

    return invoke


def _json_tail(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_bench_rollout_smoke(run):
    res = run(
        "bench",
        "rollout",
        "--model",
        "toy",
        *SMALL,
        "--ragged",
        "2",
        "-a",
        "cache=prefix",
        "-a",
        "decoding=threshold",
        "-a",
        "threshold=0.5",
    )
    assert res.exit_code == 0, res.output
    data = _json_tail(res.output)
    assert data["bench"] == "rollout"
    assert data["configs"]["baseline"]["backend"] == "low_confidence"
    acc = data["configs"]["accelerated"]
    assert acc["backend"] == "fast" and acc["config"]["cache"] == "prefix"
    assert acc["config"]["decoding"] == "threshold" and acc["config"]["threshold"] == 0.5
    for side in ("baseline", "accelerated"):
        s = data[side]
        assert s["runs"] == 2 and s["tokens_per_s"] > 0 and s["peak_memory_mb"] > 0
        assert len(s["seconds_per_run_each"]) == 2
    assert data["baseline"]["nfe_per_run"] == 8 and data["baseline"]["tokens_per_forward"] == 1.0
    assert data["ratios"]["tokens_per_s"] == pytest.approx(
        data["accelerated"]["tokens_per_s"] / data["baseline"]["tokens_per_s"], rel=1e-2
    )
    assert 0.0 <= data["token_agreement"] <= 1.0
    assert data["machine"]["cpu_count"] >= 1 and data["machine"]["torch"] == torch.__version__
    assert data["setup"]["prompt_length"] == 6 and data["model"]["family"] == "toy"
    # the interleaved order is visible in the progress lines
    order = [ln.split("]")[1].split(":")[0].strip() for ln in res.output.splitlines() if ln.startswith("[")]
    assert order == ["baseline", "accelerated", "baseline", "accelerated"]


def test_bench_rollout_with_a_task_reports_accuracy(run):
    res = run(
        "bench",
        "rollout",
        "--model",
        "toy",
        "--task",
        "math500",
        "--num-prompts",
        "3",
        "--gen-length",
        "8",
        "--block-length",
        "4",
        "--batch",
        "2",
        "--repeats",
        "1",
    )
    assert res.exit_code == 0, res.output
    data = _json_tail(res.output)
    assert data["setup"]["num_prompts"] == 3
    assert 0.0 <= data["baseline"]["accuracy"] <= 1.0
    assert "accuracy" in res.output


def test_bench_rl_smoke(run):
    res = run("bench", "rl", "--model", "toy", *SMALL, "--group-size", "2", "--repeats", "1")
    assert res.exit_code == 0, res.output
    data = _json_tail(res.output)
    assert data["bench"] == "rl"
    for side in ("eager", "accelerated"):
        s = data[side]
        assert s["step_time_s"] >= s["rollout_s"] > 0 and s["update_s"] > 0 and s["logprob_s"] > 0
    assert data["ratios"]["step_speedup"] > 0


def test_bench_rl_restores_the_weights(run, monkeypatch):
    seen = []
    from dare_plugin_bench import rl as rl_mod

    real = rl_mod._rl_step

    def spy(setup, *args):
        pid, pmask, _ = setup.prompts[0]  # batch 4, group size 2: two prompts, each twice
        assert torch.equal(pid[0], pid[1]) and torch.equal(pid[2], pid[3])
        assert not torch.equal(pid[0], pid[2])
        seen.append({k: v.clone() for k, v in setup.wrapper.module.state_dict().items()})
        return real(setup, *args)

    monkeypatch.setattr(rl_mod, "_rl_step", spy)
    res = run("bench", "rl", "--model", "toy", *SMALL, "--lr", "0.1")
    assert res.exit_code == 0, res.output
    assert len(seen) == 4
    for state in seen[1:]:
        assert all(torch.equal(state[k], seen[0][k]) for k in state)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gen-length", "10", "--block-length", "4"], "multiple of --block-length"),
        (["--batch", "0"], "--batch must be positive"),
        (["--repeats", "-1"], "--repeats must be positive"),
        (["--size", "dim=8"], "--size only applies to --random"),
        (["--accelerated-backend", "warp"], "warp"),
        (["-a", "cache=full"], "cache"),
        (["-a", "bogus=1"], "unknown key"),
        (["-b", "novalue"], "expected key=value"),
        (
            ["--device", "cuda:7"] if not torch.cuda.is_available() else ["--batch", "-3"],
            "cuda" if not torch.cuda.is_available() else "--batch",
        ),
    ],
)
def test_bench_rollout_bad_arguments_are_one_line(run, args, needle):
    line = _one_line_error(run("bench", "rollout", "--model", "toy", *args))
    assert needle in line


def test_bench_errors_that_need_the_model(run):
    line = _one_line_error(run("bench", "rollout", "--model", "toy", "--random", checkpoint=False))
    assert "cannot create random checkpoints" in line
    line = _one_line_error(run("bench", "rollout", "--model", "toy", checkpoint=False))
    assert "--checkpoint" in line
    line = _one_line_error(run("bench", "rollout", "--model", "nosuch"))
    assert "nosuch" in line
    line = _one_line_error(run("bench", "rl", "--model", "toy", "--batch", "3", "--group-size", "2"))
    assert "--group-size" in line


def test_bench_rollout_refuses_a_backend_the_model_cannot_serve(run, monkeypatch):
    real = toy.make_toy_wrapper

    def no_cache(*a, **k):
        w = real(*a, **k)
        w.capabilities = w.capabilities - {"kv_cache"}
        return w

    monkeypatch.setattr(toy, "make_toy_wrapper", no_cache)
    line = _one_line_error(run("bench", "rollout", "--model", "toy", *SMALL))
    assert "kv_cache" in line


@pytest.mark.skipif(
    importlib.util.find_spec("dare_plugin_bench.train") is not None, reason="the training bench is installed"
)
def test_bench_train_without_its_module_is_one_line(run):
    line = _one_line_error(run("bench", "train", "--model", "toy", checkpoint=False))
    assert "dare_plugin_bench.train" in line


def test_interleave_order_memory_and_prepare():
    calls = []
    out = interleave(
        {"a": lambda: calls.append("a") or {"x": 1}, "b": lambda: calls.append("b") or {}},
        repeats=3,
        device="cpu",
        prepare=lambda name: calls.append("prep-" + name),
    )
    assert calls == ["prep-a", "a", "prep-b", "b"] * 3
    assert len(out["a"]) == 3 and out["a"][0]["x"] == 1 and out["a"][0]["seconds"] >= 0


def test_peak_memory_sees_a_large_allocation():
    with PeakMemory("cpu") as small:
        torch.zeros(10)
    with PeakMemory("cpu") as big:
        t = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del t
    if big.kind == "rss":
        assert big.peak - small.peak > 32 * 2**20
    assert big.peak > 0


def test_random_prompts_avoid_special_ids_and_left_pad():
    w = make_toy_wrapper()
    ids, mask = random_prompts(w, batch=4, length=10, seed=0, ragged=3)
    assert mask.sum(1).tolist() == [10, 7, 4, 1]  # (3 * 3) % 10 = 9 pads
    special = {w.mask_token_id, w.eos_token_id, w.pad_token_id, *w.tokenizer.all_special_ids}
    assert not any(int(t) in special for t in ids[mask.bool()])
    assert (ids[~mask.bool()] == w.pad_token_id).all()


def test_bench_train_dispatches_its_arguments_to_main(run, monkeypatch):
    import sys
    import types

    got = []
    fake = types.ModuleType("dare_plugin_bench.train")
    fake.main = lambda argv: got.append(argv) or 3
    monkeypatch.setitem(sys.modules, "dare_plugin_bench.train", fake)
    res = run("bench", "train", "--part", "ce", "--help", checkpoint=False)
    assert got == [["--part", "ce", "--help"]]
    assert res.exit_code == 3
