"""``dare bench rollout``: a baseline and an accelerated rollout backend on the same prompts.

Both sides generate from the same checkpoint and the same (left-padded) prompts, interleaved
(baseline, accelerated, baseline, ...). Reported per side: generated tokens per second (rows x
gen_length / wall time), seconds per rollout, forward calls (``nfe``), seconds per forward call,
response tokens committed per forward call and row, peak memory, and with ``--task`` the
held-out accuracy; plus the fraction of response tokens both sides agree on and the ratios.
When the accelerated backend runs static-shape steps (``graphs`` other than ``eager``; ``auto`` on
CUDA), a third side, *cached*, runs it with ``graphs=eager`` (:func:`graphs_twin`), and the ratios
add the cached side over the baseline and the accelerated side over the cached one.
"""

from __future__ import annotations

from typing import Any

import click
import torch

from dare_plugin_bench.common import emit_json, interleave, machine_info, print_table, ratio
from dare_plugin_bench.setup import build, config_text, model_options


def graphs_twin(specs: dict[str, Any], device: str) -> dict[str, Any]:
    """``specs`` (baseline, accelerated), with a ``cached`` side in between when the accelerated
    config has a ``graphs`` field that runs static steps on ``device`` (not ``eager``; ``auto`` only
    on CUDA): the same backend and settings with ``graphs=eager``."""
    import attrs

    spec, cfg = specs["accelerated"]
    graphs = attrs.asdict(cfg).get("graphs")
    if graphs in (None, "eager") or (graphs == "auto" and not str(device).startswith("cuda")):
        return specs
    return {
        "baseline": specs["baseline"],
        "cached": (spec, attrs.evolve(cfg, graphs="eager")),
        "accelerated": specs["accelerated"],
    }


def _generate_all(setup: Any, backend: Any, seed: int) -> dict[str, Any]:
    """One rollout of every prompt batch; returns facts for the bench table."""
    wrapper = setup.wrapper
    gen = torch.Generator(device="cpu").manual_seed(seed)
    responses, nfe, tokens, rows, correct = [], 0, 0, 0, 0.0
    for pid, pmask, examples in setup.prompts:
        out = backend.generate(wrapper, pid, pmask, generator=gen)
        nfe += int(out.nfe)
        tokens += out.response_ids.numel()
        rows += out.response_ids.shape[0]
        responses.append(out.response_ids.cpu())
        if examples is not None and setup.task is not None:
            from dare_core.api import decode_responses

            texts = decode_responses(wrapper, out.response_ids.cpu(), out.response_mask.cpu())
            correct += sum(setup.task.score(ex, t).acc for ex, t in zip(examples, texts))
    facts: dict[str, Any] = {"nfe": nfe, "tokens": tokens, "rows": rows, "responses": torch.cat(responses)}
    if setup.task is not None:
        facts["accuracy"] = correct / max(1, rows)
    return facts


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sum(r["seconds"] for r in runs)
    cpu = sum(r["cpu_seconds"] for r in runs)
    tokens = sum(r["tokens"] for r in runs)
    nfe = sum(r["nfe"] for r in runs)
    rows = sum(r["rows"] for r in runs)
    out = {
        "runs": len(runs),
        "seconds_per_run": round(seconds / len(runs), 4),
        "seconds_per_run_each": [round(r["seconds"], 3) for r in runs],
        "tokens_per_s": round(tokens / seconds, 3) if seconds else None,
        "tokens_per_cpu_s": round(tokens / cpu, 3) if cpu else None,
        "cpu_seconds_per_run": round(cpu / len(runs), 4),
        "nfe_per_run": nfe // len(runs),
        "step_time_s": round(seconds / nfe, 5) if nfe else None,
        "tokens_per_forward": round(tokens / (nfe * rows / len(runs)), 3) if nfe else None,
        "peak_memory_mb": round(max(r["peak_memory_bytes"] for r in runs) / 2**20, 1),
        "memory_kind": runs[0]["memory_kind"],
    }
    if "accuracy" in runs[0]:
        out["accuracy"] = round(sum(r["accuracy"] for r in runs) / len(runs), 4)
    return out


@click.command("rollout")
@model_options
@click.option(
    "--warmup",
    default=0,
    show_default=True,
    type=int,
    help="Untimed runs of every side before the timed ones (one-time costs such as "
    "capturing CUDA graphs stay out of the timing).",
)
def rollout_cmd(warmup: int, **kw: Any) -> None:
    """Rollout speed: baseline vs accelerated backend on one checkpoint, interleaved.

    Example (the issue's CPU target, a ~50M-parameter random model):
    dare bench rollout --model FAMILY --random --size d_model=512 --size n_layers=15 ...
    """
    from dare_core.api import get_dare
    from dare_plugin_bench.common import BenchError

    if warmup < 0:
        raise BenchError(f"--warmup must be >= 0, got {warmup}")
    setup = build(get_dare(), kw)
    wrapper = setup.wrapper
    n_params = sum(p.numel() for p in wrapper.module.parameters())
    specs = graphs_twin(setup.specs, setup.device)
    backends = {side: spec.build(cfg) for side, (spec, cfg) in specs.items()}
    seed = kw["seed"]
    click.echo(
        f"model: {setup.source}, {n_params / 1e6:.1f}M parameters, {kw['dtype']}, "
        f"{setup.device}; {sum(p[0].shape[0] for p in setup.prompts)} prompts of "
        f"{setup.prompts[0][0].shape[1]} tokens (padded), batch {kw['batch']}"
    )
    for side, (spec, cfg) in specs.items():
        click.echo(f"{side}: {spec.name} {config_text(cfg)}")
    runs = {side: (lambda b=b: _generate_all(setup, b, seed)) for side, b in backends.items()}
    if warmup:
        interleave(runs, warmup, setup.device)
    results = interleave(runs, kw["repeats"], setup.device, progress=click.echo)

    summary = {side: summarise(rs) for side, rs in results.items()}
    base, acc = summary["baseline"], summary["accelerated"]
    same = results["baseline"][-1]["responses"] == results["accelerated"][-1]["responses"]
    agreement = round(float(same.float().mean()), 4)
    ratios = _ratios(acc, base)
    if "cached" in summary:
        cached = summary["cached"]
        ratios.update(
            {f"{k}_cached": v for k, v in _ratios(cached, base).items() if k in ("tokens_per_s", "tokens_per_cpu_s")}
        )
        ratios.update({f"{k}_graphs": v for k, v in _ratios(acc, cached).items() if k in ("tokens_per_s", "step_time")})
        same_cached = results["cached"][-1]["responses"] == results["accelerated"][-1]["responses"]
        ratios["token_agreement_graphs"] = round(float(same_cached.float().mean()), 4)
    header = [
        "config",
        "backend",
        "tok/s",
        "tok/cpu-s",
        "s/run",
        "nfe",
        "s/forward",
        "tok/forward",
        f"peak MB ({base['memory_kind']})",
    ]
    if setup.task is not None:
        header.append("accuracy")
    rows = []
    for side, s in summary.items():
        row = [
            side,
            specs[side][0].name,
            s["tokens_per_s"],
            s["tokens_per_cpu_s"],
            s["seconds_per_run"],
            s["nfe_per_run"],
            s["step_time_s"],
            s["tokens_per_forward"],
            s["peak_memory_mb"],
        ]
        if setup.task is not None:
            row.append(s["accuracy"])
        rows.append(row)
    click.echo("")
    print_table(header, rows)
    click.echo(
        f"speed-up {ratios['tokens_per_s']}x tokens/s (wall), {ratios['tokens_per_cpu_s']}x "
        f"tokens per CPU second; identical response tokens: {agreement:.1%}"
    )
    if "cached" in summary:
        click.echo(
            f"cached without graphs {ratios['tokens_per_s_cached']}x; static steps over it "
            f"{ratios['tokens_per_s_graphs']}x tokens/s (identical tokens "
            f"{ratios['token_agreement_graphs']:.1%})"
        )
    emit_json(
        {
            "bench": "rollout",
            "model": {"source": setup.source, "family": wrapper.family, "parameters": n_params, "dtype": kw["dtype"]},
            "setup": {
                "batch": kw["batch"],
                "prompt_length": int(setup.prompts[0][0].shape[1]),
                "gen_length": kw["gen_length"],
                "block_length": kw["block_length"],
                "num_prompts": sum(p[0].shape[0] for p in setup.prompts),
                "task": kw["task"],
                "repeats": kw["repeats"],
                "warmup": warmup,
                "seed": seed,
            },
            "configs": {side: {"backend": spec.name, "config": _plain(cfg)} for side, (spec, cfg) in specs.items()},
            **summary,
            "ratios": ratios,
            "token_agreement": agreement,
            "machine": machine_info(setup.device),
        }
    )


def _ratios(acc: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokens_per_s": ratio(acc["tokens_per_s"] or 0, base["tokens_per_s"] or 0),
        "tokens_per_cpu_s": ratio(acc["tokens_per_cpu_s"] or 0, base["tokens_per_cpu_s"] or 0),
        "seconds_per_run": ratio(base["seconds_per_run"], acc["seconds_per_run"]),
        "step_time": ratio(acc["step_time_s"] or 0, base["step_time_s"] or 0),
        "nfe": ratio(acc["nfe_per_run"], base["nfe_per_run"]),
        "peak_memory": ratio(acc["peak_memory_mb"], base["peak_memory_mb"]),
    }


def _plain(cfg: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(cfg)
