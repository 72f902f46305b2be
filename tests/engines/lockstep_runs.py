"""Rank functions of the lockstep tests (imported by name in the spawned ranks): every family's
default rollout backend and ``fast`` with threshold decoding generate on rank-specific prompts
(different lengths and contents, so that the ranks finish after different numbers of forwards)
with the policy sharded by ``fsdp`` and by DeepSpeed ZeRO-3 (every parameter partitioned), and
with the same policy unsharded in this process (the 1-process result of these prompts)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from typing import Any

import attrs
import torch

#: family -> (plugin module, rollout backend, rollout config changes)
CASES = {
    "llada": ("dare_plugin_llada", "low_confidence", {"gen_length": 8, "block_length": 4, "steps": 8}),
    "llada-fast": (
        "dare_plugin_llada",
        "fast",
        {"gen_length": 8, "block_length": 4, "steps": 8, "decoding": "threshold", "threshold": 0.3},
    ),
    "dream": ("dare_plugin_dream", None, {"gen_length": 8, "steps": 8}),
    "sdar": ("dare_plugin_sdar", None, {"gen_length": 8, "steps": 4}),
    "llada2": ("dare_plugin_llada2", None, {"gen_length": 8, "steps": 4, "threshold": 0.3}),
    "diffusiongemma": ("dare_plugin_diffusiongemma", None, {"gen_length": 8}),
}
#: the engines whose forwards are collective
ENGINE_PLUGINS = ("dare_plugin_fsdp.plugin", "dare_plugin_deepspeed.plugin")
#: rank -> its prompt (the ranks' prompts differ in length and content)
PROMPTS = ("1 2", "9 8 7 6 5 4 3 2 1 0 9 8 7 6 5 4 3")


def _backend(dare: Any, family: Any, name: str | None, changes: dict[str, Any]) -> Any:
    spec = dare.registries.rollouts.get(name or family.default_rollout)
    cfg = spec.config_cls()
    fields = {f.name for f in attrs.fields(type(cfg))}
    return spec.build(attrs.evolve(cfg, **{k: v for k, v in changes.items() if k in fields}))


def _counting(module: torch.nn.Module) -> list[int]:
    count = [0]
    module.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def rollouts(root: str, cases: list[str], engines: list[tuple[str, int]], use_lockstep: bool = True) -> dict[str, Any]:
    """For each engine (``(fsdp or zero3, port)``) and case: this rank's response ids from the sharded
    policy (inside :func:`~dare_core.api.lockstep` when ``use_lockstep``) and from the unsharded one,
    and the forwards the unsharded generation made."""
    from dare_core.api import DareError, lockstep
    from dare_core.config import resolve
    from dare_core.testing.engines import BASE_PLUGINS, _plugin
    from dare_core.testing.registries import build_for

    rank = int(os.environ["RANK"])
    modules = sorted({CASES[c][0] for c in cases})
    dare = build_for(*[_plugin(p) for p in (*BASE_PLUGINS, *ENGINE_PLUGINS, *modules)])
    out: dict[str, Any] = {}
    for eng_name, port in engines:
        os.environ["MASTER_PORT"] = str(port)  # each engine its own process group
        over = (
            ["engine.name=fsdp"]
            if eng_name == "fsdp"
            else ["engine.name=deepspeed", "deepspeed.zero_stage=3", f"deepspeed.config={root}/zero3.json"]
        )
        cfg = resolve(
            dare,
            algo="sup_test",
            model="toy",
            overrides=[
                "model.device=cpu",
                f"model.path={root}/ckpt",
                f"output_dir={root}/runs",
                "trainer.micro_batch_size=1",
                "model.cross_entropy=naive",
                *over,
            ],
        )
        engine = dare.registries.engines.get(cfg.engine.name).build(cfg)
        for case in cases:
            module, name, changes = CASES[case]
            family = dare.registries.models.get(importlib.import_module(module).__name__.split("_")[-1])
            path = importlib.import_module(f"{module}.config").BUNDLED
            backend = _backend(dare, family, name, changes)
            plain, sharded = family.load(path), family.load(path)
            ids = torch.tensor([plain.encode(PROMPTS[rank])])
            mask = torch.ones_like(ids)
            count = _counting(plain.module)
            with torch.no_grad():
                ref = backend.generate(plain, ids, mask, generator=torch.Generator().manual_seed(5))
            key = f"{eng_name}/{case}"
            try:
                engine.prepare(sharded, trainable=True)
                engine.setup_optimizer(sharded, cfg.trainer)  # ZeRO-3 partitions here
                with (
                    torch.no_grad(),
                    lockstep(engine, sharded, ids, mask) if use_lockstep else contextlib.nullcontext(),
                ):
                    got = backend.generate(sharded, ids, mask, generator=torch.Generator().manual_seed(5))
            except DareError as exc:  # refused before any forward, on every rank
                out[key] = {"refused": str(exc), "forwards": count[0]}
                continue
            out[key] = {"same": bool(torch.equal(ref.response_ids, got.response_ids)), "forwards": count[0]}
        engine.close()
    return out


def write_zero3(root: str) -> None:
    """A DeepSpeed file partitioning every parameter (no persistence threshold)."""
    with open(os.path.join(root, "zero3.json"), "w") as fh:
        json.dump(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "zero_optimization": {
                    "stage": "auto",
                    "stage3_param_persistence_threshold": 0,
                    "stage3_model_persistence_threshold": 0,
                },
            },
            fh,
        )


def train_jobs(jobs: list[tuple]) -> list[dict[str, Any]]:
    """``(port, plugins, model, overrides)`` trained in turn (the RL loop with evaluation before
    and after); rank 0: the step records, the final weights, the evaluations and their samples."""
    from dare_core.config import resolve
    from dare_core.testing.engines import BASE_PLUGINS, _plugin
    from dare_core.testing.registries import build_for
    from dare_core.train import train

    out = []
    for port, plugins, model, overrides in jobs:
        os.environ["MASTER_PORT"] = str(port)
        dare = build_for(*[_plugin(p) for p in (*BASE_PLUGINS, *plugins)])
        summary = train(dare, resolve(dare, algo="pg_test", model=model, overrides=list(overrides)))
        if os.environ.get("RANK", "0") != "0":
            out.append({})
            continue
        root = summary["run_dir"]
        with open(os.path.join(root, "metrics.jsonl")) as fh:
            records = [json.loads(line) for line in fh]
        samples = {}
        for label in ("before", "after"):
            with open(os.path.join(root, "eval_samples", f"{label}.json")) as fh:
                samples[label] = json.load(fh)
        from safetensors.torch import load_file

        weights = load_file(os.path.join(root, "final", "model.safetensors"))
        out.append({"records": records, "eval": summary["eval"], "samples": samples, "weights": weights})
    return out
