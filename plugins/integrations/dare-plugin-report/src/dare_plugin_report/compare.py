"""Paired comparison of checkpoints on the same held-out prompts (``dare compare``).

Checkpoint A and each checkpoint B answer the same ``task.num_eval`` held-out prompts, each
``samples`` times, with the run's evaluation sampler (``eval.*``) and *common random numbers*:
sample ``i`` of every checkpoint is drawn with the same sampling noise, so the comparison is
paired per sample. For each B the report gives both accuracies, the samples B gains and loses
against A with McNemar's exact p-value, the prompts B solves more / less often than A with a sign
test, and the prompt-clustered difference (:func:`dare_core.pairing.clustered`: the prompt is the
unit, its solve-rate change the measurement). A is evaluated once however many B there are. With
``pool`` and more than one B, A is also compared with the mean of the B (each prompt's solve rate
averaged over them, e.g. the seeds of one recipe), prompt-clustered.

``bundled`` in place of a directory names the family's bundled checkpoint. With ``cache`` each
evaluation's per-sample results are kept in that directory under a digest of everything that
decides the answers (:func:`cache_key`), and a repeated evaluation is read back instead of run.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Optional, Sequence

import attrs
import click

from dare_core.api import (
    DareError,
    RunConfig,
    atomic_write_text,
    compare,
    describe,
    eval_backend_name,
    eval_context,
    evaluate,
    paired_counts,
    resolve,
    to_dict,
)
from dare_plugin_report.stats import clustered, describe_clustered, per_prompt

__all__ = [
    "BUNDLED",
    "cache_key",
    "checkpoint_config",
    "compare_checkpoints",
    "paired_report",
    "pooled_report",
    "sampled_items",
]

#: the name that stands for the model family's bundled checkpoint instead of a directory
BUNDLED = "bundled"

Echo = Callable[[str], None]


def judged_by_training_rollout(dare: Any, config: RunConfig) -> RunConfig:
    """``config`` with its evaluation set to the sampler the run trains with, as its algorithm
    adjusts it (``RunConfig.train_rollout``, e.g. one token per step, left to right, at the
    algorithm's temperature): the rollout section and the evaluation rollout become it,
    ``eval.backend`` is cleared and ``eval.steps`` / ``eval.temperature`` are taken from it. An
    algorithm's ``RolloutNeeds.wrap`` (e.g. a tree of partial states) is training bookkeeping over
    the same sampler and is not applied."""
    if not config.algo:
        raise DareError(
            "judging by the training sampler needs the run's algorithm; pass the run's "
            "config.yaml (--config) or algo=NAME"
        )
    rc = config.train_rollout
    names = {f.name for f in attrs.fields(type(rc))}
    changes: dict[str, Any] = {"backend": None}
    if "steps" in names:
        changes["steps"] = rc.steps
    if "temperature" in names:
        changes["temperature"] = rc.temperature
    return attrs.evolve(config, rollout=rc, eval=attrs.evolve(config.eval, **changes), eval_rollout=rc)


def checkpoint_config(
    dare: Any, model: str, path: str, config_file: Optional[str] = None, overrides: Sequence[str] = ()
) -> Any:
    """The evaluation config of checkpoint ``path`` (a directory or ``bundled``): the run config
    of ``config_file`` and ``overrides`` with ``model.path`` set and progress bars off."""
    merged = ["progress=false", *overrides]
    if path != BUNDLED:
        if not os.path.isdir(path):
            raise DareError(f"checkpoint directory {path!r} does not exist; pass a directory or {BUNDLED!r}")
        merged.append(f"model.path={path}")
    return resolve(dare, model=model, config_file=config_file, overrides=merged, need_algo=False)


def cache_key(dare: Any, cfg: Any, samples: int) -> str:
    """A digest of what decides an evaluation's answers: the checkpoint's files (relative path,
    size, modification time), the evaluation sampler as built (backend and resolved config, so
    training-only rollout fields and the run's eval schedule — ``eval.before`` / ``after`` /
    ``every`` / ``save_samples`` — do not count), the evaluation batch size (it decides how the
    sampling noise is drawn), the task, seed, engine, prompt length and ``samples``."""
    data = to_dict(cfg)
    decisive: dict[str, Any] = {key: data[key] for key in ("seed", "model", "task", "engine")}
    decisive["max_prompt_length"] = data["trainer"]["max_prompt_length"]
    decisive["eval_batch_size"] = cfg.eval.batch_size
    decisive["sampler"] = [eval_backend_name(cfg), attrs.asdict(cfg.eval_rollout)]
    decisive["samples"] = samples
    root = os.path.realpath(cfg.model.path)
    files = []
    for folder, _, names in os.walk(root):
        for name in names:
            full = os.path.join(folder, name)
            st = os.stat(full)
            files.append((os.path.relpath(full, root), st.st_size, st.st_mtime_ns))
    decisive["weights"] = sorted(files)
    text = json.dumps(decisive, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def sampled_items(dare: Any, cfg: Any, samples: int) -> tuple[list[float], dict]:
    """Evaluate ``cfg``'s checkpoint on its held-out prompts, each ``samples`` times in a row:
    the per-sample accuracies (prompt-major) and the evaluation's result record."""
    ctx = eval_context(dare, cfg)
    examples = ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
    repeated = [ex for ex in examples for _ in range(samples)]
    items: list[float] = []
    result = evaluate(ctx, repeated, "paired", items)
    return items, result


def _cached_items(dare: Any, cfg: Any, samples: int, cache: Optional[str], echo: Echo) -> tuple[list[float], dict]:
    if cache is None:
        return sampled_items(dare, cfg, samples)
    path = os.path.join(cache, f"{cache_key(dare, cfg, samples)}.json")
    if os.path.exists(path):
        try:
            with open(path) as fh:
                saved = json.load(fh)
            items, result = saved["items"], saved["result"]
        except (OSError, ValueError, KeyError, TypeError):
            raise DareError(f"cache entry {path} is damaged; delete it to evaluate anew") from None
        echo(f"(cached: {cfg.model.path} from {path})")
        return items, result
    items, result = sampled_items(dare, cfg, samples)
    # written atomically: an interrupted evaluation leaves no half-written entry
    atomic_write_text(
        path, json.dumps({"checkpoint": cfg.model.path, "samples": samples, "result": result, "items": items})
    )
    return items, result


def paired_report(
    name_a: str, a: Sequence[float], res_a: dict, name_b: str, b: Sequence[float], res_b: dict, k: int
) -> tuple[list[str], dict]:
    """The printed lines and the JSON record comparing B with A; ``a`` and ``b`` hold ``k``
    consecutive samples per prompt, sample ``i`` of both drawn with the same noise."""
    gained, lost = paired_counts(a, b)
    per_a, per_b = per_prompt(a, k), per_prompt(b, k)
    more = sum(1 for x, y in zip(per_a, per_b) if y > x)
    less = sum(1 for x, y in zip(per_a, per_b) if y < x)
    by_sample = compare(gained, lost, len(a))
    by_prompt = compare(more, less, len(per_a))
    clus = clustered(a, b, k)
    lines = [
        f"A {name_a}: accuracy {res_a['accuracy']:.4f}   B {name_b}: accuracy {res_b['accuracy']:.4f} "
        f"({len(per_a)} prompts x {k} samples)",
        f"samples: {describe(by_sample)}",
        f"prompts solved more / less often by B: +{more} / -{less}, sign-test p = {by_prompt['p_value']:.3g}",
        f"prompt-clustered difference: {describe_clustered(clus)}",
    ]
    record = {"a": res_a, "b": res_b, "b_path": name_b, "samples": by_sample, "prompts": by_prompt, "clustered": clus}
    return lines, record


def pooled_report(
    names_b: Sequence[str], a: Sequence[float], bs: Sequence[Sequence[float]], k: int
) -> tuple[list[str], dict]:
    """The printed line and the JSON record comparing A with the per-sample mean of all B."""
    mean_b = [sum(col) / len(bs) for col in zip(*bs)]
    accuracy = sum(mean_b) / len(mean_b) if mean_b else 0.0
    clus = clustered(a, mean_b, k)
    line = f"pooled over {len(bs)} B: accuracy {accuracy:.4f}, prompt-clustered difference {describe_clustered(clus)}"
    return [line], {"pooled": list(names_b), "accuracy": accuracy, "clustered": clus}


def compare_checkpoints(
    dare: Any,
    model: str,
    a: str,
    bs: Sequence[str],
    *,
    samples: int = 8,
    config_file: Optional[str] = None,
    pool: bool = False,
    cache: Optional[str] = None,
    training_sampler: bool = False,
    overrides: Sequence[str] = (),
    echo: Echo = click.echo,
) -> list[dict]:
    """Compare each checkpoint of ``bs`` with ``a`` (see the module docstring); ``echo`` gets
    the report, each comparison ending in its JSON record on one line. Returns the records (one
    per B, then the pooled one with ``pool`` and several B).

    Every input error (bad ``samples``, a missing checkpoint directory, a config problem of any
    checkpoint, a ``cache`` that is a file) is raised before the first evaluation.
    """
    if samples < 1:
        raise DareError(f"--samples must be at least 1, got {samples}")
    if not bs:
        raise DareError("nothing to compare; pass at least one --b checkpoint")
    configs = [checkpoint_config(dare, model, path, config_file, overrides) for path in [a, *bs]]
    if training_sampler:
        configs = [judged_by_training_rollout(dare, cfg) for cfg in configs]
    if cache is not None and os.path.exists(cache) and not os.path.isdir(cache):
        raise DareError(f"--cache {cache!r} is a file; pass a directory")
    items_a, res_a = _cached_items(dare, configs[0], samples, cache, echo)
    records, items_bs = [], []
    for path, cfg in zip(bs, configs[1:]):
        items_b, res_b = _cached_items(dare, cfg, samples, cache, echo)
        lines, record = paired_report(a, items_a, res_a, path, items_b, res_b, samples)
        for line in lines:
            echo(line)
        echo(json.dumps(record))
        records.append(record)
        items_bs.append(items_b)
    if pool and len(items_bs) > 1:
        lines, record = pooled_report(bs, items_a, items_bs, samples)
        for line in lines:
            echo(line)
        echo(json.dumps(record))
        records.append(record)
    return records
