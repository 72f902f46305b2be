"""Argument handling shared by ``dare bench rollout`` and ``dare bench rl``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional, Sequence

import attrs
import click
import torch

from dare_core.api import misfit, parse_overrides, structure
from dare_plugin_bench.common import BenchError, prepare_model, random_prompts

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_options(fn):
    """Options selecting the checkpoint, the prompts and the rollout settings both sides share."""
    opts = [
        click.option("--model", "family", required=True, help="Model family (see `dare list models`)."),
        click.option(
            "--checkpoint",
            default=None,
            type=click.Path(file_okay=False),
            help="Checkpoint directory (default: the family's bundled checkpoint).",
        ),
        click.option(
            "--random",
            "random_model",
            is_flag=True,
            help="Benchmark a randomly initialised checkpoint of the family's architecture (sizes from --size).",
        ),
        click.option(
            "--size",
            "sizes",
            multiple=True,
            metavar="KEY=VALUE",
            help="Architecture field of the --random model, e.g. d_model=512 (repeatable).",
        ),
        click.option(
            "--tokenizer-task",
            default="sudoku",
            show_default=True,
            help="Task whose texts train the --random model's tokenizer.",
        ),
        click.option(
            "--task",
            default=None,
            help="Use this task's held-out prompts (and report accuracy) instead of random prompts.",
        ),
        click.option(
            "--num-prompts",
            default=0,
            show_default=True,
            type=int,
            help="--task: number of held-out prompts (0 = --batch).",
        ),
        click.option("--prompt-length", default=64, show_default=True, type=int, help="Length of the random prompts."),
        click.option(
            "--ragged",
            default=0,
            show_default=True,
            type=int,
            help="Random prompts: row i is left padded by (i * RAGGED) % prompt-length.",
        ),
        click.option("--batch", default=4, show_default=True, type=int, help="Rows per rollout."),
        click.option("--gen-length", default=256, show_default=True, type=int, help="Response length."),
        click.option("--block-length", default=32, show_default=True, type=int, help="Block length."),
        click.option(
            "--steps",
            default=0,
            show_default=True,
            type=int,
            help="Denoising steps where a backend uses a step count (0 = gen-length: one token per step).",
        ),
        click.option(
            "--temperature",
            default=0.0,
            show_default=True,
            type=float,
            help="Sampling temperature of both sides (0 = greedy).",
        ),
        click.option(
            "--baseline-backend", default="low_confidence", show_default=True, help="Rollout backend of the baseline."
        ),
        click.option(
            "--accelerated-backend",
            default="fast",
            show_default=True,
            help="Rollout backend of the accelerated configuration.",
        ),
        click.option(
            "-b",
            "--baseline",
            "baseline_overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="Baseline rollout config field (repeatable).",
        ),
        click.option(
            "-a",
            "--accelerated",
            "accelerated_overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="Accelerated rollout config field (repeatable), e.g. -a decoding=threshold.",
        ),
        click.option(
            "--repeats",
            default=2,
            show_default=True,
            type=int,
            help="Timed runs per configuration (interleaved A, B, A, B, ...).",
        ),
        click.option("--dtype", default="float32", show_default=True, type=click.Choice(sorted(DTYPES))),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
        click.option(
            "--threads",
            default=0,
            show_default=True,
            type=int,
            help="torch.set_num_threads (0 = leave torch's default).",
        ),
        click.option("--seed", default=0, show_default=True, type=int),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


ACCELERATED_DEFAULTS = {"cache": "dual", "decoding": "quota"}


@attrs.frozen
class Setup:
    dare: Any
    wrapper: Any
    source: str
    device: str
    prompts: list  # list of (ids [B, P], mask [B, P], examples or None)
    task: Any
    specs: dict  # name -> (RolloutSpec, config)


def _sizes(items: Sequence[str]) -> dict[str, Any]:
    sizes, problems = parse_overrides(items)
    if problems:
        raise BenchError("; ".join(problems))
    return sizes


def rollout_config(
    dare: Any,
    name: str,
    backend: str,
    common: dict[str, Any],
    overrides: Sequence[str],
    defaults: Optional[dict[str, Any]] = None,
):
    """``(spec, config)`` of one side: ``common`` (where the backend has the field), then
    ``defaults``, then ``overrides``; unknown keys and invalid values are one-line errors."""
    spec = dare.registries.rollouts.get(backend)
    names = {f.name for f in attrs.fields(spec.config_cls)}
    raw = {k: v for k, v in common.items() if k in names}
    raw.update({k: v for k, v in (defaults or {}).items() if k in names})
    extra, problems = parse_overrides(overrides)
    if problems:
        raise BenchError(f"--{name}: " + "; ".join(problems))
    raw.update(extra)
    try:
        cfg, problems = structure(spec.config_cls, raw, f"{name} rollout")
    except (ValueError, TypeError) as exc:
        raise BenchError(f"--{name}: {exc}") from None
    if problems:
        raise BenchError("; ".join(problems))
    return spec, cfg


def check_backend(spec: Any, wrapper: Any, side: str) -> None:
    """One-line error when the ``side`` backend cannot drive the loaded model (the config
    loader's kinds/requires check, on the wrapper instead of the registered family)."""
    model = SimpleNamespace(kind=wrapper.kind, capabilities=wrapper.capabilities, name=wrapper.family)
    problem = misfit(f"the {side} backend {spec.name!r}", spec, model, f"choose another --{side}-backend")
    if problem:
        raise BenchError(problem)


def validate(kw: dict[str, Any]) -> None:
    """One-line errors for bad numbers before anything is loaded."""
    for key in ("batch", "gen_length", "block_length", "repeats", "prompt_length"):
        if kw[key] <= 0:
            raise BenchError(f"--{key.replace('_', '-')} must be positive, got {kw[key]}")
    for key in ("steps", "threads", "num_prompts", "ragged"):
        if kw[key] < 0:
            raise BenchError(f"--{key.replace('_', '-')} must be >= 0, got {kw[key]}")
    if kw["gen_length"] % kw["block_length"]:
        raise BenchError(
            f"--gen-length ({kw['gen_length']}) must be a multiple of --block-length ({kw['block_length']})"
        )
    if kw["checkpoint"] and kw["random_model"]:
        raise BenchError("pass either --checkpoint or --random, not both")
    if kw["sizes"] and not kw["random_model"]:
        raise BenchError("--size only applies to --random models; add --random")
    if kw["device"].startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {kw['device']} but no CUDA device is available; use --device cpu")


def build(dare: Any, kw: dict[str, Any], extra_defaults: Optional[dict[str, Any]] = None) -> Setup:
    validate(kw)
    dare.registries.models.get(kw["family"])  # unknown family: one line, before any work
    for side in ("baseline", "accelerated"):
        dare.registries.rollouts.get(kw[f"{side}_backend"])
    if kw["task"]:
        dare.registries.tasks.get(kw["task"])
    if kw["threads"]:
        torch.set_num_threads(kw["threads"])
    common = {
        "gen_length": kw["gen_length"],
        "block_length": kw["block_length"],
        "steps": kw["steps"] or kw["gen_length"],
        "temperature": kw["temperature"],
    }
    specs = {
        "baseline": rollout_config(dare, "baseline", kw["baseline_backend"], common, kw["baseline_overrides"]),
        "accelerated": rollout_config(
            dare, "accelerated", kw["accelerated_backend"], common, kw["accelerated_overrides"], ACCELERATED_DEFAULTS
        ),
    }
    wrapper, source = prepare_model(
        dare,
        kw["family"],
        checkpoint=kw["checkpoint"],
        random_sizes=_sizes(kw["sizes"]) if kw["random_model"] else None,
        tokenizer_task=kw["tokenizer_task"],
        dtype=DTYPES[kw["dtype"]],
        device=kw["device"],
        seed=kw["seed"],
    )
    for side, (spec, _cfg) in specs.items():
        check_backend(spec, wrapper, side)
    task = None
    prompts = []
    if kw["task"]:
        from dare_core.api import TaskConfig, left_pad

        task = dare.registries.tasks.get(kw["task"]).build(TaskConfig(name=kw["task"], seed=kw["seed"]))
        n = kw["num_prompts"] or kw["batch"]
        examples = task.examples("eval", limit=n, seed=kw["seed"])
        if not examples:
            raise BenchError(f"task {kw['task']!r} has no held-out examples")
        for i in range(0, len(examples), kw["batch"]):
            chunk = examples[i : i + kw["batch"]]
            ids = [wrapper.encode(wrapper.render_prompt(ex.prompt)) for ex in chunk]
            pid, pmask = left_pad(ids, wrapper.pad_token_id)
            prompts.append((pid.to(kw["device"]), pmask.to(kw["device"]), chunk))
    else:
        pid, pmask = random_prompts(wrapper, kw["batch"], kw["prompt_length"], kw["seed"], kw["ragged"])
        prompts.append((pid.to(kw["device"]), pmask.to(kw["device"]), None))
    return Setup(dare, wrapper, source, kw["device"], prompts, task, specs)


def config_text(cfg: Any, keys: Sequence[str] = ()) -> str:
    d = attrs.asdict(cfg)
    shown = keys or list(d)
    return " ".join(f"{k}={d[k]}" for k in shown if k in d)


__all__ = [
    "ACCELERATED_DEFAULTS",
    "DTYPES",
    "Setup",
    "build",
    "check_backend",
    "config_text",
    "model_options",
    "rollout_config",
    "validate",
]
