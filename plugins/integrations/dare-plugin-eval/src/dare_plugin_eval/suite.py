"""The evaluation suite behind ``dare eval``: several tasks, one model load, ``samples``
generations per prompt with the evaluation sampler (the rollout backend of ``eval.backend``, else
the run's), every sample scored by its task (:func:`dare_core.api.evaluate`, which shards the
prompts over the engine's ranks and gathers the scores in order), the metrics of
:mod:`dare_plugin_eval.metrics`, and an eval directory written by rank 0::

    <output_dir>/eval-<model>-<YYYYmmdd-HHMMSS>/   (or <output_dir>/<run_name>/)
        config.yaml     the resolved config (its task section: the first task's)
        results.json    per task metrics, samples, k, the model and the config
        samples.jsonl   one line per item and sample: task, item, sample, prompt, response,
                        pred, score, acc, kind

Every input error (a bad ``--tasks``, ``--samples`` or ``--k``, several samples at temperature
0, any task's config or data, the checkpoint, an existing ``run_name``) is one
:class:`~dare_core.api.DareError` raised before the model is loaded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Optional, Sequence

import attrs

from dare_core.api import (
    DareError,
    PromptFitError,
    RunDir,
    atomic_write_text,
    context_length,
    eval_context,
    evaluate,
    preflight,
    quiet,
    resolve,
    to_dict,
)
from dare_plugin_eval.metrics import summarise

__all__ = ["parse_ks", "parse_tasks", "run_suite", "table"]


def parse_tasks(text: Optional[str]) -> list[Optional[str]]:
    """The task names of ``--tasks`` (``[None]``: task.name of the config)."""
    if text is None:
        return [None]
    names = [t.strip() for t in text.split(",")]
    if not all(names):
        raise DareError(f"--tasks {text!r} has an empty name; give names separated by commas, e.g. gsm8k,math500")
    if dup := sorted({t for t in names if names.count(t) > 1}):
        raise DareError(f"--tasks names {', '.join(dup)} more than once; name each task once")
    return names


def parse_ks(text: Optional[str], samples: int) -> list[int]:
    """The k of ``--k`` (default: 1 and ``samples``); :func:`run_suite` checks them."""
    if text is None:
        return sorted({1, max(1, samples)})
    try:
        return sorted({int(k) for k in text.split(",")})
    except ValueError:
        raise DareError(f"--k {text!r} is not a comma-separated list of whole numbers, e.g. 1,8") from None


def run_suite(
    dare: Any,
    model: str,
    tasks: Sequence[Optional[str]],
    *,
    samples: int = 1,
    ks: Sequence[int] = (1,),
    config_file: Optional[str] = None,
    overrides: Sequence[str] = (),
    overwrite: bool = False,
    mc_samples: int = 32,
) -> dict[str, Any]:
    """Evaluate ``model`` on ``tasks`` (``None``: the config's task.name) and write the eval
    directory (module docstring); returns the results (results.json plus ``eval_dir``) on
    every rank."""
    for flag, value in (("--samples", samples), ("--mc-samples", mc_samples)):
        if value < 1:
            raise DareError(f"{flag} must be at least 1, got {value}")
    if bad := [k for k in ks if not 1 <= k <= samples]:
        raise DareError(
            f"--k {bad[0]} is outside 1..{samples}: pass@k and maj@k need k <= --samples; raise --samples or lower --k"
        )
    configs = [
        resolve(
            dare,
            model=model,
            config_file=config_file,
            need_algo=False,
            overrides=[*overrides, *([f"task.name={t}"] if t else [])],
        )
        for t in tasks
    ]
    first = configs[0]
    if samples > 1 and first.eval.temperature <= 0:
        raise DareError(
            f"--samples {samples} with eval.temperature={first.eval.temperature:g} would repeat the "
            f"same greedy answer; set eval.temperature above 0 (e.g. eval.temperature=1.0)"
        )
    if len(configs) > 1 and first.task.eval_path:
        raise DareError("task.eval_path names one task's data, and --tasks names several; evaluate that task alone")
    configs, checked, skipped = fit_tasks(dare, configs)  # every task's data and prompts, the checkpoint
    first = configs[0]  # the first task that runs, its prompt length sized
    main = os.environ.get("RANK", "0") == "0"
    model_name = first.model.family
    rundir = (
        RunDir.create(first.output_dir, first.run_name, f"eval-{model_name}", overwrite=overwrite) if main else None
    )
    try:
        ctx = eval_context(dare, first, task=checked[0])
    except BaseException:
        if rundir is not None and not os.listdir(rundir.root):  # refused: leave no eval directory
            os.rmdir(rundir.root)
        raise
    if rundir is not None:
        rundir.write_config(to_dict(first))
    from tqdm import tqdm

    metrics: dict[str, Any] = {}
    lines: list[str] = []
    try:
        bar = tqdm(
            configs,
            desc="tasks",
            unit="task",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None if first.progress and ctx.engine.is_main and not quiet() else True,
        )  # None: TTY only
        for cfg, task in zip(bar, checked):
            name = cfg.task.name
            bar.set_postfix_str(name)
            ctx.config, ctx.task = cfg, task
            examples = task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
            records: list[dict[str, Any]] = []
            if examples and all(ex.extra_info.get("choices") for ex in examples):  # multiple choice
                start, n = time.perf_counter(), 1
                records = choice_records(ctx, task, examples, mc_samples, cfg.seed)
                metrics[name] = {**summarise(records, 1, [1]), "seconds": round(time.perf_counter() - start, 2)}
            else:
                n = samples
                result = evaluate(ctx, [ex for ex in examples for _ in range(n)], name, records=records)
                metrics[name] = {**summarise(records, n, ks), "nfe": result["nfe"], "seconds": result["seconds"]}
            for i, rec in enumerate(records):
                prompt = examples[i // n].prompt[-1]["content"]
                lines.append(json.dumps({"task": name, "item": i // n, "sample": i % n, "prompt": prompt, **rec}))
        bar.close()
    finally:
        ctx.engine.close()
    results = {
        "model": model_name,
        "model_path": first.model.path,
        "samples": samples,
        "k": list(ks),
        "tasks": metrics,
        "skipped": skipped,
        "config": to_dict(first),
    }
    if rundir is not None:
        rundir.write_json("results.json", results)
        atomic_write_text(rundir.path("samples.jsonl"), "".join(line + "\n" for line in lines))
    return {**results, "eval_dir": rundir.root if rundir is not None else None}


def fit_tasks(dare: Any, configs: list[Any]) -> tuple[list[Any], list[Any], dict[str, str]]:
    """Each task's config with its prompt length sized to the model (the context less the
    evaluation's gen_length), checked before the model loads (:func:`~dare_core.api.preflight`);
    a task whose prompts do not fit is skipped with one line on stderr when others remain.

    Args:
        dare: the registries.
        configs: one resolved config per task.

    Returns:
        ``(configs, tasks, skipped)``: the configs and built tasks that run, and ``{task: why}``
        of the skipped ones.

    Raises:
        PromptFitError: the only task, or every task, does not fit.
    """
    context = context_length(dare, configs[0])
    kept, tasks, skipped = [], [], {}
    for cfg in configs:
        if context is not None:
            gen = getattr(cfg.eval_rollout, "gen_length", 0) or 0
            cfg = attrs.evolve(cfg, trainer=attrs.evolve(cfg.trainer, max_prompt_length=max(1, context - gen)))
        try:
            tasks.append(preflight(dare, cfg, evaluation=True))
        except PromptFitError as exc:
            if len(configs) == 1:
                raise
            skipped[cfg.task.name] = str(exc)
            print(f"skipped: {exc}", file=sys.stderr)
            continue
        kept.append(cfg)
    if not kept:
        raise PromptFitError(f"no task fits the model: {'; '.join(skipped.values())}")
    return kept, tasks, skipped


def choice_records(ctx: Any, task: Any, examples: Sequence[Any], mc_samples: int, seed: int) -> list[dict[str, Any]]:
    """Multiple-choice items answered by likelihood: each rank picks, for its share of the items,
    the choice with the highest Monte-Carlo ELBO of ``log p(choice | prompt)``
    (:func:`dare_objectives.likelihood.choose`, ``mc_samples`` masks per choice, keyed by ``seed``)
    and scores the chosen text with the task; the records of every rank, in item order."""
    from dare_objectives.likelihood import choose

    rank, world = ctx.engine.rank, ctx.engine.world_size
    shard = list(examples)[rank::world]
    mine = []
    for i, (ex, pick) in enumerate(zip(shard, choose(ctx.wrapper, shard, samples=mc_samples, seed=seed))):
        text = ex.extra_info["choices"][pick]
        s = task.score(ex, text)
        mine.append(
            (rank + world * i, {"response": text, "pred": str(pick), "score": s.score, "acc": s.acc, "kind": s.kind})
        )
    return [rec for _, rec in sorted(ctx.engine.gather(mine), key=lambda item: item[0])]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def table(results: dict[str, Any]) -> list[str]:
    """The console table of ``results``: one row per task, one column per metric (``-`` where a
    task has none, e.g. maj@k without extracted answers)."""
    rows = results["tasks"]
    columns: list[str] = []
    for metrics in rows.values():
        columns += [c for c in metrics if c not in columns and c != "samples"]
    order = ["n", "accuracy", "reward"]
    columns = (
        order
        + sorted((c for c in columns if "@" in c), key=lambda c: (c.split("@")[0] != "pass", int(c.split("@")[1])))
        + [c for c in ("nfe", "seconds", "kinds") if c in columns]
    )
    cells = [["task", *columns]] + [
        [task, *(("-" if c not in m else str(m[c]) if c == "seconds" else _cell(m[c])) for c in columns)]
        for task, m in rows.items()
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out
