"""Checks for engines: a run on N processes equals the single-process run on the same global
batch (weights and per-step metrics), with the toy family and the digits task.

An engine plugin's test::

    from dare_core.testing.engines import assert_same_as_single

    def test_two_ranks_equal_one(tmp_path):
        assert_same_as_single(tmp_path, "sup_test", ["engine.name=fsdp"], plugins=("dare_plugin_fsdp.plugin",))
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, Sequence

import torch

from dare_core.testing.distributed import run_ranks

#: the registries every check builds: the toy family, the digits task and its two algorithms
#: (``pg_test``: clipped policy gradient; ``sup_test``: supervised), the reference samplers
BASE_PLUGINS = ("dare_core.testing.toy", "dare_core.testing.digits:DigitsPlugin", "dare_plugin_samplers")

#: a tiny run: 3 optimizer steps, no evaluation, a checkpoint only at the end
TINY = [
    "task.name=digits",
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "rollout.steps=4",
    "rollout.temperature=1.0",
    "progress=false",
    "seed=3",
    "eval.before=false",
    "eval.after=false",
    "trainer.steps=3",
    "trainer.batch_size=4",
    "trainer.group_size=2",
    "trainer.micro_batch_size=2",
    "trainer.rollout_batch_size=1",
    "model.device=cpu",
]

#: metrics that measure time, not what was computed
TIMING = ("time_", "rollout_tokens_per_s")


def _plugin(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr)() if attr else mod


def train_run(plugins: Sequence[str], algo: str, overrides: Sequence[str]) -> dict[str, Any]:
    """Train ``algo`` on the toy model with the registries of ``plugins`` (import paths,
    ``module:Class`` for plugin objects); returns the final weights and the step records (on
    rank 0; an empty dict on the others). Picklable: the target of :func:`run_ranks`."""
    from dare_core.config import resolve
    from dare_core.testing.registries import build_for
    from dare_core.train import train

    dare = build_for(*[_plugin(p) for p in (*BASE_PLUGINS, *plugins)])
    summary = train(dare, resolve(dare, algo=algo, model="toy", overrides=list(overrides)))
    if not os.environ.get("RANK", "0") == "0":
        return {}
    root = summary["run_dir"]
    with open(os.path.join(root, "metrics.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    weights = torch.load(os.path.join(root, "final", "toy.pt"), weights_only=True)
    return {"weights": weights, "records": records, "summary": summary}


def same_records(a: list[dict[str, Any]], b: list[dict[str, Any]], rel: float = 1e-5) -> list[str]:
    """Differences between two runs' metric records, timing fields aside (empty = the same)."""
    if len(a) != len(b):
        return [f"{len(a)} records vs {len(b)}"]
    out = []
    for ra, rb in zip(a, b):
        for k in sorted((set(ra) | set(rb)) - {k for k in ra if k.startswith(TIMING)}):
            va, vb = ra.get(k), rb.get(k)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                differ = abs(va - vb) > rel * max(1.0, abs(va), abs(vb))
            else:
                differ = va != vb
            if differ:
                out.append(f"step {ra.get('step')}: {k} {va!r} vs {vb!r}")
    return out


def max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def assert_same_as_single(
    tmp_path: Any,
    algo: str,
    engine_overrides: Sequence[str],
    plugins: Sequence[str] = (),
    nprocs: int = 2,
    atol: float = 1e-6,
    extra: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train ``algo`` once in this process with the single-process engine and once on ``nprocs``
    ranks with ``engine_overrides``; the final weights agree within ``atol`` and the per-step
    metrics within float tolerance. Returns both runs' results."""
    common = [*TINY, f"model.path={tmp_path / 'ckpt'}", f"output_dir={tmp_path}", *extra]
    one = run_ranks(1, train_run, tuple(plugins), algo, [*common, "run_name=one"])[0]
    many = run_ranks(nprocs, train_run, tuple(plugins), algo, [*common, "run_name=many", *engine_overrides])[0]
    diff = max_weight_diff(one["weights"], many["weights"])
    assert diff <= atol, f"weights differ by {diff:.3g} (> {atol})"
    problems = same_records(one["records"], many["records"])
    assert not problems, "\n".join(problems[:10])
    return one, many
