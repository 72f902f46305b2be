"""One run's tracking: what the hooks of ``dare_plugin_tracking`` do.

``configure`` (``dare_configure``, before any work) reads and checks the ``tracking:`` section;
``start`` (``dare_on_run_start``, main process) opens the writers; ``step`` and ``evaluation``
(``dare_on_step_end``, ``dare_on_eval``) log to every open writer; ``close``
(``dare_unconfigure``, also after an error) flushes and closes them.

Layout, one step axis (the optimizer step) for everything:

* every scalar of a step's metrics under its own name (``loss``, ``reward``, ...; nested
  dicts as ``a/b``);
* every held-out evaluation under ``eval/`` at its step (``eval/accuracy``, ``eval/reward``,
  ``eval/vs_before/delta``, ...): 0 before training, N every ``eval.every`` steps,
  ``trainer.steps`` after, so ``eval/accuracy`` is one curve over training.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Mapping, Optional

from dare_core.api import to_dict
from dare_plugin_tracking.config import SECTION, TrackingConfig, check_backends
from dare_plugin_tracking.writers import TensorBoardWriter, WandbWriter, scalars


class TrackedRun:
    """The writers of one run."""

    def __init__(self, cfg: TrackingConfig, config: Any):
        self.cfg = cfg
        self.config = config
        self.writers: list[Any] = []
        self._outer: Optional[BaseException] = None

    def start(self, run_dir: str) -> None:
        cfg = self.cfg
        name = cfg.run_name or os.path.basename(os.path.normpath(run_dir))
        data = to_dict(self.config)
        self._outer = sys.exc_info()[1]  # an exception the caller was already handling
        try:
            for backend in cfg.active():
                if backend == "tensorboard":
                    self.writers.append(TensorBoardWriter(cfg.tensorboard, run_dir, name, data))
                elif backend == "wandb":
                    self.writers.append(WandbWriter(cfg.wandb, run_dir, name, cfg.tags, data))
        except BaseException:
            self.close(failed=True)
            raise

    def log(self, values: Mapping[str, float], step: int) -> None:
        for writer in self.writers:
            writer.log(values, step)

    def step(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self.writers:
            self.log(scalars({k: v for k, v in metrics.items() if k != "step"}), step)

    def evaluation(self, step: int, label: str, metrics: Mapping[str, Any]) -> None:
        if self.writers:
            self.log(scalars(metrics, "eval/"), step)

    def close(self, failed: Optional[bool] = None) -> None:
        """Close every writer; ``failed`` (default: an exception is propagating) marks the W&B
        run as failed. A writer that fails to close is reported as a warning, so the other
        writers and the other plugins' ``dare_unconfigure`` still run."""
        if failed is None:
            current = sys.exc_info()[1]
            failed = current is not None and current is not self._outer
        writers, self.writers = self.writers, []
        for writer in writers:
            try:
                writer.close(failed)
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's own error
                warnings.warn(
                    f"{SECTION}: closing the {writer.name} writer failed: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )


_ACTIVE: Optional[TrackedRun] = None


def active() -> Optional[TrackedRun]:
    """The tracked run in progress (``None`` when tracking is off or no run is)."""
    return _ACTIVE


def configure(config: Any) -> None:
    """Read and check the ``tracking:`` section; a run with backends gets a TrackedRun."""
    global _ACTIVE
    if _ACTIVE is not None:  # a previous run that was never unconfigured
        _ACTIVE.close()
        _ACTIVE = None
    cfg = config.plugin_section(SECTION, TrackingConfig)
    check_backends(cfg)
    if cfg.active():
        _ACTIVE = TrackedRun(cfg, config)


def start(run_dir: str) -> None:
    if _ACTIVE is not None:
        _ACTIVE.start(run_dir)


def step(step_: int, metrics: Mapping[str, Any]) -> None:
    if _ACTIVE is not None:
        _ACTIVE.step(step_, metrics)


def evaluation(step_: int, label: str, metrics: Mapping[str, Any]) -> None:
    if _ACTIVE is not None:
        _ACTIVE.evaluation(step_, label, metrics)


def unconfigure() -> None:
    global _ACTIVE
    run, _ACTIVE = _ACTIVE, None
    if run is not None:
        run.close()
