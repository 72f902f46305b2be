"""The tracker backends: thin wrappers around ``torch.utils.tensorboard.SummaryWriter`` and a
``wandb`` run, each with ``log(values, step)`` and ``close(failed)``.

The libraries are imported when a writer is opened, never when the plugin loads, so every
``dare`` command stays fast and a backend's package is needed only when it is used.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Mapping

import yaml

from dare_plugin_tracking.config import TensorBoardConfig, WandbConfig


def scalars(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of ``metrics`` as floats, nested mappings flattened with ``/``
    (``{"vs_before": {"delta": 0.1}}`` → ``{"vs_before/delta": 0.1}``). Booleans become 0/1;
    non-numbers (strings, lists, None) are left out; NaN and infinities are kept, so a diverging
    run shows as such (both backends store them)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, numbers.Real):  # int, float, bool, numpy scalars
            out[name] = float(value)
    return out


class TensorBoardWriter:
    """Event files under ``log_dir`` (one scalar series per metric name, the step as x-axis)."""

    name = "tensorboard"

    def __init__(self, cfg: TensorBoardConfig, run_dir: str, run_name: str, config: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        log_dir = os.path.join(cfg.log_dir, run_name) if cfg.log_dir else os.path.join(run_dir, "tensorboard")
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=log_dir, flush_secs=10)
        text = yaml.safe_dump(dict(config), sort_keys=False)
        # markdown: an indented block keeps the YAML as written
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def close(self, failed: bool) -> None:
        self.writer.close()  # flushes


class WandbWriter:
    """A W&B run (offline by default) with the resolved run config as its config."""

    name = "wandb"

    def __init__(self, cfg: WandbConfig, run_dir: str, run_name: str, tags: tuple[str, ...], config: Mapping[str, Any]):
        import wandb

        directory = cfg.dir or run_dir
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            mode=cfg.mode,
            name=run_name,
            tags=list(tags) or None,
            dir=directory,
            config=dict(config),
        )

    def log(self, values: Mapping[str, float], step: int) -> None:
        # a later call for the same step adds to that step's row (an evaluation after its step)
        self.run.log(dict(values), step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
