"""``dare init``: a new randomly initialised tiny checkpoint of a family's architecture, with a
byte-level BPE tokenizer trained on task texts (:mod:`dare_nn.tokenizers`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import torch


@click.command()
@click.option("--model", required=True, help="Model family whose architecture to instantiate.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="New checkpoint directory.")
@click.option(
    "--task",
    "tasks",
    multiple=True,
    default=("sudoku",),
    show_default=True,
    help="Task(s) whose texts train the tokenizer (repeatable).",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16"]),
    default="float32",
    show_default=True,
    help="Dtype of the saved weights (bfloat16: as published checkpoints store them).",
)
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def init(model: str, out: str, tasks: tuple[str, ...], seed: int, dtype: str, overrides: tuple[str, ...]) -> None:
    """Create a randomly initialised tiny checkpoint (tokenizer trained on task texts).

    Size overrides are architecture fields, e.g. d_model=128 n_layers=4.
    """
    import torch

    from dare_core.api import DareError, TaskConfig, get_dare, parse_overrides

    dare = get_dare()
    family = dare.registries.models.get(model)
    if family.create is None:
        raise DareError(f"model family {model!r} cannot create new checkpoints")
    sizes, problems = parse_overrides(overrides)
    if problems:
        raise DareError("; ".join(problems))
    if os.path.exists(out) and os.listdir(out):
        raise DareError(f"{out!r} exists and is not empty; choose a new --out directory")
    texts: list[str] = []
    for name in tasks:
        task = dare.registries.tasks.get(name).build(TaskConfig(name=name, seed=seed))
        for ex in task.examples("train", limit=4000, seed=seed):
            texts.extend(m["content"] for m in ex.prompt)
            if ex.response:
                texts.append(ex.response)
    torch.manual_seed(seed)
    family.create(out, texts, **sizes)
    if dtype != "float32":
        cast_safetensors(out, getattr(torch, dtype))
    click.echo(f"created {out}")


def cast_safetensors(directory: str, dtype: torch.dtype) -> None:
    """Rewrite the floating-point tensors of a checkpoint's ``*.safetensors`` in ``dtype`` and
    record it as ``dtype`` in its ``config.json``."""
    import glob
    import json

    from safetensors.torch import load_file, save_file

    for path in glob.glob(os.path.join(directory, "*.safetensors")):
        tensors = load_file(path)
        save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}, path, {"format": "pt"})
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as fh:
        config = json.load(fh)
    config["dtype"] = str(dtype).removeprefix("torch.")
    with open(config_path, "w") as fh:
        json.dump(config, fh, indent=2)
