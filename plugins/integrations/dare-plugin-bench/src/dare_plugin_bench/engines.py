"""``dare bench engines``: what the training engines cost on this machine.

Two measurements, each in processes started like ``torchrun`` starts them
(:func:`dare_core.testing.distributed.run_ranks`: spawned processes joined as a gloo group, one
thread each):

* **weak scaling** — ``dare train`` (``python -m dare_core train``, run in every rank process as
  ``torchrun -m dare_core train`` runs it) of an RL algorithm with ``--engine`` on 1 process and on ``--procs`` processes, the
  per-process batch fixed (``--batch`` prompts × ``--group-size`` rollouts), so the global batch
  grows with the processes. A step's time is ``time_rollout + time_logprob + time_update`` of the
  run's ``metrics.jsonl`` (averaged over ranks by the engine); its tokens are the global rollouts
  × ``rollout.gen_length`` (the positions a diffusion rollout computes). The first step (warm-up)
  is dropped and the median of the others taken. The ratio of the tokens/s is ``--procs`` when
  the processes do not slow each other down.
* **memory per rank** — the bytes one rank holds for the policy (``Engine.memory()``: parameters,
  gradients, optimizer state; local shards) after one optimizer step on a random batch, for the
  single-process engine and for each sharding engine on ``--procs`` ranks. The run is built the
  way the core builds it (``dare_core.api.setup``), then ``setup_optimizer``, one backward of
  ``logsumexp(logits).mean()`` and one ``step``. Gradients are counted after the backward
  (engines free them in ``step``); parameters and optimizer state after the step. A fully
  sharding engine holds about ``1 / --procs`` of the single engine's bytes.
* **load peak per rank** — in the same runs, the largest rank's private host memory gained while
  the run is set up (``RssAnon`` sampled by :class:`dare_core.testing.memory.PeakSampler`: the
  model loaded and prepared by the engine, the task read), against the whole model's parameter
  bytes. The page cache of the mmapped checkpoint is not counted: one process's ``from_pretrained``
  maps the safetensors on the CPU and holds its weights there (about 0 private bytes), where a
  GPU run copies the whole model to the device; fsdp's ranks hold only their shards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
from typing import Any, Optional, Sequence

import click

from dare_plugin_bench.common import BenchError, emit_json, machine_info, print_table, ratio

#: engines that shard the policy over the processes, measured by default when installed
SHARDED = ("fsdp", "deepspeed")

#: the environment of every process: one thread each
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: run config fields every engine run uses, whatever the algorithm's defaults
FIXED = ["eval.before=false", "eval.after=false", "progress=false", "trainer.save_final=false", "model.device=cpu"]

#: overrides an engine needs for the memory measurement (ZeRO-3 shards the parameters too)
ENGINE_OVERRIDES = {"deepspeed": ["deepspeed.zero_stage=3"]}

#: what ``Engine.memory()`` reports, in bytes
PARTS = ("parameters", "gradients", "optimizer")

#: how long a group of processes may take before it is stopped (seconds)
TIMEOUT = 3600


# --------------------------------------------------------------------------- process bodies
def _train_rank(args: Sequence[str]) -> None:
    """One rank of a training run: ``python -m dare_core train ARGS`` (what ``torchrun -m
    dare_core train`` starts on every rank) in this process, with the launcher environment
    ``run_ranks`` gave it (``RANK``, ``WORLD_SIZE``, ...) and one thread."""
    import runpy

    import torch

    torch.set_num_threads(1)  # torch was imported before run_ranks set OMP_NUM_THREADS
    log = io.StringIO()
    argv, sys.argv = sys.argv, ["dare", "train", *args]
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            runpy.run_module("dare_core", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            tail = "\n".join(log.getvalue().strip().splitlines()[-15:])
            raise RuntimeError(f"`dare train` exited with {exc.code}:\n{tail}") from None
    finally:
        sys.argv = argv


def _memory_rank(algo: str, family: str, overrides: Sequence[str], rows: int, length: int, seed: int) -> dict[str, int]:
    """One rank of the memory measurement: the run's context, one optimizer step, the engine's
    ``memory()`` (gradients after the backward, the rest after the step)."""
    import torch

    from dare_core.api import get_dare, resolve, setup
    from dare_core.testing.memory import PeakSampler
    from dare_plugin_bench.common import random_prompts

    torch.set_num_threads(1)  # torch was imported before run_ranks set OMP_NUM_THREADS
    log = io.StringIO()  # model loading, training-path and engine messages: not the bench's output
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        dare = get_dare()
        cfg = resolve(dare, algo=algo, model=family, overrides=list(overrides))
        dare.registries.models.get(family).load(cfg.model.path, device="meta")  # imports first
        with PeakSampler("RssAnon") as load:
            ctx = setup(dare, cfg)
        engine = ctx.engine
        try:
            engine.setup_optimizer(ctx.wrapper, cfg.trainer)
            ids, _ = random_prompts(ctx.wrapper, rows, length, seed)
            ctx.wrapper.module.train()
            with engine.autocast():
                loss = ctx.wrapper.logits(ids.to(engine.device)).float().logsumexp(-1).mean()
            engine.backward(loss)
            after_backward = engine.memory()
            engine.step(1.0, 1e-6)
            after_step = engine.memory()
        finally:
            engine.close()
    return {
        "parameters": int(after_step["parameters"]),
        "gradients": int(after_backward["gradients"]),
        "optimizer": int(after_step["optimizer"]),
        "load_peak": load.gain,
        "precision": engine.precision,
    }


# --------------------------------------------------------------------------- measurements
def _run_groups(nprocs: int, fn: Any, *args: Any) -> list[Any]:
    from dare_core.testing.distributed import RankFailed, run_ranks

    try:
        return run_ranks(nprocs, fn, *args, timeout=TIMEOUT, env=dict(ONE_THREAD))
    except RankFailed as exc:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        last = re.sub(r"^dare_core\.errors\.\w+: ", "", lines[-1]) if lines else str(exc)
        raise _RunFailed(last) from None


class _RunFailed(Exception):
    """A group of processes failed; the message is the last line of the failing rank's error."""


def _step_records(path: str) -> list[dict[str, Any]]:
    with open(path) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    return [r for r in records if "eval" not in r and "time_rollout" in r]


def _scaling_run(
    nprocs: int, algo: str, family: str, overrides: list[str], out_root: str, run_name: str
) -> list[dict[str, Any]]:
    """The step records of one training run on ``nprocs`` processes."""
    args = ["--algo", algo, "--model", family, *overrides, f"output_dir={out_root}", f"run_name={run_name}"]
    try:
        _run_groups(nprocs, _train_rank, args)
    except _RunFailed as exc:
        raise BenchError(f"the {nprocs}-process training run failed: {exc}") from None
    records = _step_records(os.path.join(out_root, run_name, "metrics.jsonl"))
    if not records:
        raise BenchError(
            f"the {nprocs}-process run logged no RL step timings (time_rollout); --algo must be an RL algorithm"
        )
    if len(records) < 2:
        raise BenchError(f"the {nprocs}-process run logged {len(records)} steps; --steps must be >= 2")
    return records


def _step_seconds(record: dict[str, Any]) -> float:
    return record["time_rollout"] + record.get("time_logprob", 0.0) + record["time_update"]


def _scaling_summary(
    nprocs: int, runs: list[list[dict[str, Any]]], rows_per_proc: int, gen_length: int
) -> dict[str, Any]:
    """Median over every run's steps but its first (warm-up)."""
    timed = [r for records in runs for r in records[1:]]
    step_s = statistics.median(_step_seconds(r) for r in timed)
    rows = rows_per_proc * nprocs
    tokens = rows * gen_length
    response = statistics.median(r["response_length"] for r in timed) * rows
    return {
        "processes": nprocs,
        "rows_per_step": rows,
        "tokens_per_step": tokens,
        "step_s": round(step_s, 4),
        "tokens_per_s": round(tokens / step_s, 2) if step_s else None,
        "response_tokens_per_s": round(response / step_s, 2) if step_s else None,
        "rollout_s": round(statistics.median(r["time_rollout"] for r in timed), 4),
        "logprob_s": round(statistics.median(r.get("time_logprob", 0.0) for r in timed), 4),
        "update_s": round(statistics.median(r["time_update"] for r in timed), 4),
        "step_s_each": [[round(_step_seconds(r), 3) for r in records] for records in runs],
    }


def _memory_run(
    name: str, nprocs: int, algo: str, family: str, overrides: list[str], rows: int, length: int, seed: int
) -> dict[str, Any]:
    run = [*overrides, f"engine.name={name}", *ENGINE_OVERRIDES.get(name, [])]
    try:
        per_rank = _run_groups(nprocs, _memory_rank, algo, family, run, rows, length, seed)
    except _RunFailed as exc:
        return {"engine": name, "ranks": nprocs, "error": str(exc)}
    first = per_rank[0]
    out = {"engine": name, "ranks": nprocs, "precision": first["precision"]}
    for key in (*PARTS, "load_peak"):
        out[key] = first[key]
        out[f"{key}_max_rank"] = max(r[key] for r in per_rank)
    out["total"] = first["parameters"] + first["gradients"] + first["optimizer"]
    return out


# --------------------------------------------------------------------------- options
def _installed_sharded(dare: Any) -> list[str]:
    names = []
    for name in SHARDED:
        if name not in dare.registries.engines:
            continue
        if name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
            continue
        names.append(name)
    return names


def _memory_engines(dare: Any, text: str) -> list[str]:
    if text == "auto":
        return ["single", *_installed_sharded(dare)]
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise BenchError("--engines takes a comma-separated list of engine names (or auto)")
    for name in names:
        if name not in dare.registries.engines:
            raise BenchError(
                f"--engines: unknown engine {name!r}; installed: {', '.join(dare.registries.engines.names())}"
            )
    return ["single", *[n for n in dict.fromkeys(names) if n != "single"]]


def _resolve(dare: Any, algo: str, family: str, overrides: list[str], what: str) -> Any:
    from dare_core.api import DareError, resolve

    try:
        return resolve(dare, algo=algo, model=family, overrides=overrides)
    except DareError as exc:
        message = " ".join(str(exc).split())
        raise BenchError(f"{what}: {message}") from None


def _loadavg() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _mb(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**20:.3f}"


# --------------------------------------------------------------------------- command
@click.command("engines")
@click.option("--model", "family", default="llada", show_default=True, help="Model family.")
@click.option(
    "--checkpoint",
    default=None,
    type=click.Path(file_okay=False),
    help="Checkpoint directory (default: the family's bundled checkpoint).",
)
@click.option(
    "--algo", default="d1", show_default=True, help="RL algorithm of the scaling runs and of the memory runs' config."
)
@click.option("--task", default="sudoku", show_default=True, help="Task of the scaling runs.")
@click.option(
    "--part",
    default="all",
    show_default=True,
    type=click.Choice(["scaling", "memory", "all"]),
    help="scaling: tokens/s on 1 vs --procs processes; memory: bytes per rank per engine.",
)
@click.option(
    "--engine", default="ddp", show_default=True, help="Distributed engine of the scaling runs (`dare list engines`)."
)
@click.option(
    "--engines",
    "memory_engines",
    default="auto",
    show_default=True,
    help="Engines of the memory part, comma separated; single is always measured (the "
    "reference). auto = single and every installed sharding engine (fsdp, deepspeed "
    "with deepspeed.zero_stage=3).",
)
@click.option(
    "--procs", default=2, show_default=True, type=int, help="Processes of the multi-process runs (one thread each)."
)
@click.option(
    "--steps",
    default=6,
    show_default=True,
    type=int,
    help="Training steps per scaling run (the first is a warm-up, not timed).",
)
@click.option(
    "--batch",
    default=2,
    show_default=True,
    type=int,
    help="Prompts per process per step (trainer.batch_size = BATCH × processes).",
)
@click.option("--group-size", default=4, show_default=True, type=int, help="Rollouts per prompt.")
@click.option(
    "--gen-length",
    default=0,
    show_default=True,
    type=int,
    help="rollout.gen_length (0 = the run config's; 40 on the bundled LLaDA checkpoint).",
)
@click.option(
    "--block-length",
    default=0,
    show_default=True,
    type=int,
    help="rollout.block_length (0 = the run config's when it divides --gen-length, else --gen-length).",
)
@click.option(
    "--repeats",
    default=2,
    show_default=True,
    type=int,
    help="Scaling runs per process count, interleaved (1, N, 1, N, ...); the median step is taken over all of them.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "-o",
    "--override",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Run config field of every run (repeatable), e.g. -o rollout.steps=16.",
)
def engines_cmd(
    family: str,
    checkpoint: Optional[str],
    algo: str,
    task: str,
    part: str,
    engine: str,
    memory_engines: str,
    procs: int,
    steps: int,
    batch: int,
    group_size: int,
    gen_length: int,
    block_length: int,
    repeats: int,
    seed: int,
    overrides: tuple[str, ...],
) -> None:
    """Engines on this machine: weak scaling (tokens/s of an RL step, 1 vs N processes, fixed
    per-process batch) and memory per rank (parameters, gradients, optimizer state)."""
    from dare_core.api import get_dare

    for key, value, low in (
        ("--procs", procs, 2),
        ("--steps", steps, 2),
        ("--batch", batch, 1),
        ("--group-size", group_size, 1),
        ("--gen-length", gen_length, 0),
        ("--repeats", repeats, 1),
        ("--block-length", block_length, 0),
    ):
        if value < low:
            raise BenchError(f"{key} must be >= {low}, got {value}")
    if block_length and gen_length and gen_length % block_length:
        raise BenchError(f"--gen-length ({gen_length}) must be a multiple of --block-length ({block_length})")
    load_before = _loadavg()
    dare = get_dare()
    dare.registries.models.get(family)  # unknown names: one line, before any work
    dare.registries.algorithms.get(algo)
    do_scaling, do_memory = part in ("scaling", "all"), part in ("memory", "all")
    names = _memory_engines(dare, memory_engines) if do_memory else []
    if do_scaling:
        _check_scaling_engine(dare, engine)

    # the run configs: the algorithm's defaults, then the bench's sizes, then -o overrides
    common = [f"task.name={task}", f"seed={seed}", *FIXED]
    if checkpoint:
        common.append(f"model.path={os.path.abspath(checkpoint)}")
    base = _resolve(dare, algo, family, [*common, *overrides], "run config")
    if not hasattr(getattr(base, "rollout", None), "gen_length"):
        raise BenchError(f"--algo {algo} has no rollout with a gen_length; choose an RL algorithm")
    gen_length = gen_length or int(base.rollout.gen_length)
    sized = [
        f"trainer.steps={steps}",
        f"trainer.group_size={group_size}",
        f"trainer.micro_batch_size={batch * group_size}",
        "trainer.mini_batch_size=0",
        "trainer.rollout_batch_size=0",
        f"rollout.gen_length={gen_length}",
    ]
    block = getattr(base.rollout, "block_length", None)
    if block is not None:
        block = block_length or (block if gen_length % block == 0 else gen_length)
        sized.append(f"rollout.block_length={block}")
    runs = {
        n: [*common, *sized, f"trainer.batch_size={batch * n}", f"engine.name={engine}", *overrides] for n in (1, procs)
    }
    memory_config = [*common, *sized, f"trainer.batch_size={batch * procs}", *overrides]
    for n, run in runs.items() if do_scaling else ():
        _resolve(dare, algo, family, run, f"the {n}-process run config")
    for name in names:
        _resolve(
            dare,
            algo,
            family,
            [*memory_config, f"engine.name={name}", *ENGINE_OVERRIDES.get(name, [])],
            f"the memory run config of engine {name}",
        )

    click.echo(
        f"model {family} ({base.model.path}), algo {algo}, task {task}; at most {procs} processes, 1 thread each"
    )
    ratios: dict[str, Any] = {}
    scaling = memory = None
    if do_scaling:
        scaling = _measure_scaling(runs, algo, family, engine, steps, repeats, batch * group_size, gen_length)
        one, many = scaling["runs"]["1"], scaling["runs"][str(procs)]
        ratios["weak_scaling"] = ratio(many["tokens_per_s"] or 0.0, one["tokens_per_s"] or 0.0)
        ratios["weak_scaling_ideal"] = float(procs)
        scaling["command"] = f"OMP_NUM_THREADS=1 torchrun --nproc_per_node={procs} -m dare_core train " + shlex.join(
            ["--algo", algo, "--model", family, *runs[procs]]
        )
    if do_memory:
        memory = {}
        for name in names:
            n = 1 if name == "single" else procs
            click.echo(f"memory: engine {name} on {n} rank(s) ...")
            memory[name] = _memory_run(name, n, algo, family, memory_config, batch * group_size, gen_length, seed)
        ref = memory["single"]
        if "error" in ref:
            raise BenchError(f"the single-process memory run failed: {ref['error']}")
        ratios["memory_per_rank"] = {
            name: {key: ratio(r[key], ref[key]) for key in (*PARTS, "total")}
            for name, r in memory.items()
            if name != "single" and "error" not in r
        }
        # the largest rank's private memory at set-up against the whole model's parameters
        ratios["load_peak_vs_model"] = {
            name: ratio(r["load_peak_max_rank"], ref["parameters"]) for name, r in memory.items() if "error" not in r
        }

    click.echo("")
    if scaling is not None:
        _print_scaling(scaling, ratios, procs)
    if memory is not None:
        _print_memory(memory, ratios)
    emit_json(
        {
            "bench": "engines",
            "model": {"family": family, "checkpoint": base.model.path},
            "setup": {
                "algo": algo,
                "task": task,
                "part": part,
                "procs": procs,
                "threads_per_process": 1,
                "steps": steps,
                "repeats": repeats,
                "batch_per_process": batch,
                "group_size": group_size,
                "gen_length": gen_length,
                "block_length": block,
                "seed": seed,
                "overrides": list(overrides),
            },
            "scaling": scaling,
            "memory": memory,
            "ratios": ratios,
            "machine": {**machine_info("cpu"), "loadavg_before": load_before},
        }
    )


def _check_scaling_engine(dare: Any, engine: str) -> None:
    if engine not in dare.registries.engines:
        raise BenchError(
            f"--engine: unknown engine {engine!r}; installed: {', '.join(dare.registries.engines.names())}"
        )
    if not dare.registries.engines.get(engine).distributed:
        raise BenchError(
            f"--engine {engine} runs one process; the scaling part needs a distributed engine (e.g. ddp, fsdp)"
        )


def _measure_scaling(
    runs: dict[int, list[str]],
    algo: str,
    family: str,
    engine: str,
    steps: int,
    repeats: int,
    rows_per_proc: int,
    gen_length: int,
) -> dict[str, Any]:
    """Every run of ``runs`` (processes → overrides) ``repeats`` times, interleaved."""
    records: dict[int, list] = {n: [] for n in runs}
    with tempfile.TemporaryDirectory(prefix="dare-bench-engines-") as out_root:
        for rep in range(repeats):
            for n, run in runs.items():
                click.echo(f"[{rep + 1}/{repeats}] scaling: {n} process(es), engine {engine}, {steps} steps ...")
                records[n].append(_scaling_run(n, algo, family, run, out_root, f"procs{n}-{rep}"))
    return {
        "engine": engine,
        "runs": {str(n): _scaling_summary(n, rs, rows_per_proc, gen_length) for n, rs in records.items()},
    }


def _print_scaling(scaling: dict[str, Any], ratios: dict[str, Any], procs: int) -> None:
    print_table(
        ["processes", "engine", "rows/step", "tokens/step", "step s (median)", "tokens/s"],
        [
            [
                r["processes"],
                scaling["engine"],
                r["rows_per_step"],
                r["tokens_per_step"],
                r["step_s"],
                r["tokens_per_s"],
            ]
            for r in scaling["runs"].values()
        ],
    )
    click.echo(f"weak scaling: {ratios['weak_scaling']}x tokens/s on {procs} processes (ideal {float(procs)})")
    click.echo("")


def _print_memory(memory: dict[str, Any], ratios: dict[str, Any]) -> None:
    table = []
    for name, r in memory.items():
        if "error" in r:
            table.append([name, r["ranks"], "-", "-", "-", "-", "-", "-", "-", "-", f"error: {r['error']}"])
            continue
        rel = ratios["memory_per_rank"].get(name, {}) if name != "single" else {"parameters": 1.0, "total": 1.0}
        table.append(
            [
                name,
                r["ranks"],
                r["precision"],
                *(_mb(r[k]) for k in (*PARTS, "total")),
                rel.get("parameters"),
                rel.get("total"),
                _mb(r["load_peak_max_rank"]),
                ratios["load_peak_vs_model"].get(name),
            ]
        )
    print_table(
        [
            "engine",
            "ranks",
            "precision",
            "parameters MiB",
            "gradients MiB",
            "optimizer MiB",
            "total MiB / rank",
            "parameters vs single",
            "total vs single",
            "load peak MiB / rank",
            "load peak vs model",
        ],
        table,
    )


__all__ = ["engines_cmd"]
