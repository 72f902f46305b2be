"""Is checkpoint B better than checkpoint A on the held-out prompts? A paired evaluation.

    python scripts/paired_eval.py --model llada --a PATH_A --b PATH_B [--b PATH_B2 ...] [--samples 8]
        [--config RUN/config.yaml] [KEY=VALUE ...]

Both checkpoints answer the same held-out prompts (``task.num_eval`` of them, each ``--samples``
times) with the run's evaluation sampler (``eval.*``; ``KEY=VALUE`` run-config overrides, e.g.
``eval.temperature=1.0 eval.backend=fast``; ``--config`` a run's ``config.yaml``, to evaluate with its
settings) and *common random numbers*:
sample ``i`` of both checkpoints uses the same sampling noise, so the comparison is paired per
sample. Prints each accuracy, the samples B gains and loses against A, McNemar's exact p-value,
the same count per prompt (prompts B solves more / less often than A: a sign test) and the
prompt-clustered difference (``dare_core.pairing.clustered``: the prompt as the unit, its
solve-rate change as the measurement). ``--a`` or ``--b`` may be ``bundled`` (the family's
bundled checkpoint). ``--b`` may be repeated: each B is compared with A, which is evaluated once;
``--pool`` then also compares A with the mean of the B (e.g. the seeds of one recipe: each
prompt's solve rate averaged over them, prompt-clustered). Bad input is one ``error:`` line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import attrs

from dare_core.config import resolve
from dare_core.config.loader import to_dict
from dare_core.errors import DareError, run_script
from dare_core.pairing import clustered, compare, describe, describe_clustered, paired_counts, per_prompt
from dare_core.plugins import build
from dare_core.rundir import atomic_write_text
from dare_core.workflows.common import (eval_backend_name, eval_context, eval_rollout_config, evaluate,
                                        judged_by_training_rollout)


def _config(dare, args, path: str):
    overrides = ["progress=false", *args.overrides]
    if path != "bundled":
        if not os.path.isdir(path):
            raise DareError(f"checkpoint directory {path!r} does not exist; pass a directory or 'bundled'")
        overrides.append(f"model.path={path}")
    return resolve(dare, model=args.model, config_file=args.config, overrides=overrides, need_algo=False)


def _cache_key(dare, cfg, samples: int) -> str:
    """A digest of what decides an evaluation's answers: the checkpoint's files, the evaluation
    sampler as built (backend and resolved config, so training-only rollout fields and the run's
    eval schedule — ``eval.before`` / ``after`` / ``every`` / ``save_samples`` — do not count),
    the task, seed, engine and prompt length."""
    data = to_dict(cfg)
    decisive = {key: data[key] for key in ("seed", "model", "task", "engine")}
    decisive["max_prompt_length"] = data["trainer"]["max_prompt_length"]
    decisive["eval_batch_size"] = cfg.eval.batch_size  # chunking decides how sampling noise is drawn
    decisive["sampler"] = [eval_backend_name(cfg), attrs.asdict(eval_rollout_config(cfg, dare))]
    decisive["samples"] = samples
    root = os.path.realpath(cfg.model.path)
    decisive["weights"] = sorted(
        (os.path.relpath(os.path.join(d, f), root), st.st_size, st.st_mtime_ns)
        for d, _, files in os.walk(root) for f in files
        for st in [os.stat(os.path.join(d, f))]
    )
    text = json.dumps(decisive, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _cached_items(dare, cfg, samples: int, cache: str | None) -> tuple[list[float], dict]:
    if cache is None:
        return _items(dare, cfg, samples)
    path = os.path.join(cache, f"{_cache_key(dare, cfg, samples)}.json")
    if os.path.exists(path):
        with open(path) as fh:
            saved = json.load(fh)
        print(f"(cached: {cfg.model.path} from {path})", flush=True)
        return saved["items"], saved["result"]
    items, res = _items(dare, cfg, samples)
    # atomic: a crash leaves no half-written entry
    atomic_write_text(path, json.dumps({"checkpoint": cfg.model.path, "samples": samples,
                                        "result": res, "items": items}))
    return items, res


def _items(dare, cfg, samples: int) -> tuple[list[float], dict]:
    ctx = eval_context(dare, cfg)
    examples = ctx.task.examples("eval", limit=cfg.task.num_eval, seed=cfg.seed)
    repeated = [ex for ex in examples for _ in range(samples)]
    items: list[float] = []
    res = evaluate(ctx, repeated, "paired", items)
    return items, res


def _report(name_a: str, a: list[float], res_a: dict, name_b: str, b: list[float], res_b: dict,
            k: int) -> None:
    gained, lost = paired_counts(a, b)
    per_a, per_b = per_prompt(a, k), per_prompt(b, k)
    more = sum(1 for x, y in zip(per_a, per_b) if y > x)
    less = sum(1 for x, y in zip(per_a, per_b) if y < x)
    record = compare(gained, lost, len(a))
    print(f"A {name_a}: accuracy {res_a['accuracy']:.4f}   B {name_b}: accuracy {res_b['accuracy']:.4f} "
          f"({len(per_a)} prompts x {k} samples)")
    print(f"samples: {describe(record)}")
    prompts = compare(more, less, len(per_a))
    print(f"prompts solved more / less often by B: +{more} / -{less}, sign-test p = {prompts['p_value']:.3g}")
    clus = clustered(a, b, k)
    print(f"prompt-clustered difference: {describe_clustered(clus)}")
    print(json.dumps({"a": res_a, "b": res_b, "b_path": name_b, "samples": record, "prompts": prompts,
                      "clustered": clus}), flush=True)


def main(argv=None, dare=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model family")
    ap.add_argument("--a", required=True, help="checkpoint A (or 'bundled')")
    ap.add_argument("--b", required=True, action="append",
                    help="checkpoint B (or 'bundled'); repeat to compare several with A")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt")
    ap.add_argument("--config", default=None, help="run config file (e.g. a run's config.yaml)")
    ap.add_argument("--pool", action="store_true",
                    help="also compare A with the mean of all B (e.g. one recipe's seeds), prompt-clustered")
    ap.add_argument("--cache", default=None,
                    help="directory keeping each evaluation's results; a repeated evaluation is read back")
    ap.add_argument("--training-sampler", action="store_true",
                    help="judge with the sampler the run trains with, as its algorithm adjusts it "
                         "(e.g. JustGRPO: one token per step, left to right, at its temperature); "
                         "replaces eval.backend, eval.steps and eval.temperature; needs the run's --config")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE run-config overrides")
    args = ap.parse_args(argv)
    dare = dare if dare is not None else build()
    configs = [_config(dare, args, path) for path in [args.a, *args.b]]  # every config error first
    if args.training_sampler:
        configs = [judged_by_training_rollout(dare, cfg) for cfg in configs]
    if args.cache is not None and os.path.exists(args.cache) and not os.path.isdir(args.cache):
        raise DareError(f"--cache {args.cache!r} is a file; pass a directory")
    a, res_a = _cached_items(dare, configs[0], args.samples, args.cache)
    bs = []
    for path, cfg in zip(args.b, configs[1:]):
        b, res_b = _cached_items(dare, cfg, args.samples, args.cache)
        _report(args.a, a, res_a, path, b, res_b, args.samples)
        bs.append(b)
    if args.pool and len(bs) > 1:
        mean_b = [sum(col) / len(bs) for col in zip(*bs)]
        accuracy = sum(mean_b) / len(mean_b)
        clus = clustered(a, mean_b, args.samples)
        print(f"pooled over {len(bs)} B: accuracy {accuracy:.4f}, prompt-clustered difference "
              f"{describe_clustered(clus)}")
        print(json.dumps({"pooled": args.b, "accuracy": accuracy, "clustered": clus}), flush=True)
    return 0


if __name__ == "__main__":
    run_script(main)
