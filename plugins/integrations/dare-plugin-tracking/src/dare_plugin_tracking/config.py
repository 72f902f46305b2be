"""The ``tracking:`` section of the run config, and the check that the chosen backends can run.

The section belongs to this plugin (registered with ``dare_register_config_sections``); the core
knows neither the section nor the backends. ``metrics.jsonl`` in the run directory is written
whether or not a tracker is on and stays the record of the run; the trackers are views of it.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Literal, Optional

import attrs

from dare_core.api import DareError, option

SECTION = "tracking"

# backend -> (modules it imports, in order; the package to pip install)
BACKENDS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard", "torch.utils.tensorboard"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
}


def _close(name: str) -> str:
    close = difflib.get_close_matches(name, list(BACKENDS), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _backends(_inst: Any, attr: Any, value: tuple[str, ...]) -> None:
    if len(value) > 1 and all(len(v) == 1 for v in value):  # a bare string, split into letters
        given = "".join(value)
        if given in BACKENDS:
            raise ValueError(f"{attr.name} must be a list, e.g. {SECTION}.{attr.name}=[{given}]")
        value = (given,)
    for name in value:
        if name not in BACKENDS:
            raise ValueError(f"{attr.name} must list backends from: {', '.join(BACKENDS)}; got {name!r}{_close(name)}")
    if len(set(value)) < len(value):
        raise ValueError(f"{attr.name} names a backend twice: {list(value)!r}")


@attrs.frozen
class TensorBoardConfig:
    """TensorBoard event files (backend ``tensorboard``)."""

    log_dir: Optional[str] = option(
        None,
        "Directory of the event files; null = <run dir>/tensorboard. A directory given here "
        "gets one subdirectory per run (<log_dir>/<run name>), so runs sharing it stay apart.",
    )


@attrs.frozen
class WandbConfig:
    """Weights & Biases (backend ``wandb``)."""

    project: str = option("dare", "W&B project.")
    entity: Optional[str] = option(None, "W&B entity (user or team); null = your default entity.")
    mode: Literal["offline", "online", "disabled"] = option(
        "offline",
        "offline (default: a run never waits on the network or a login) = write the run "
        "under <dir>/wandb/ and upload it later with `wandb sync`; online = stream to the "
        "W&B server (needs `wandb login`); disabled = no W&B output, wandb not needed.",
    )
    dir: Optional[str] = option(None, "Directory in which W&B creates its wandb/ folder; null = the run directory.")


@attrs.frozen
class TrackingConfig:
    """Experiment tracking: every step's scalar metrics and every held-out evaluation, sent to
    TensorBoard and/or Weights & Biases (``metrics.jsonl`` is written either way)."""

    backends: tuple[str, ...] = option(
        (), "Trackers to write to: tensorboard, wandb (a list, e.g. [tensorboard, wandb]); empty = off.", _backends
    )
    run_name: Optional[str] = option(None, "Name of the run in the trackers; null = the run directory's name.")
    tags: tuple[str, ...] = option((), "Tags of the W&B run (a list).")
    tensorboard: TensorBoardConfig = attrs.field(factory=TensorBoardConfig, metadata={"help": "TensorBoard options."})
    wandb: WandbConfig = attrs.field(factory=WandbConfig, metadata={"help": "Weights & Biases options."})

    def active(self) -> tuple[str, ...]:
        """The backends that write something (``wandb`` with ``mode=disabled`` does not)."""
        return tuple(b for b in self.backends if not (b == "wandb" and self.wandb.mode == "disabled"))


def check_backends(cfg: TrackingConfig) -> None:
    """Raise a one-line :class:`DareError` for a backend that is unknown or whose package cannot
    be imported, naming the fix."""
    for name in cfg.backends:
        if name not in BACKENDS:
            raise DareError(
                f"{SECTION}.backends: unknown backend {name!r}{_close(name)}; choose from {', '.join(BACKENDS)}"
            )
    for name in cfg.active():
        modules, package = BACKENDS[name]
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                reason = " ".join(str(exc).split())
                raise DareError(
                    f"{SECTION}.backends includes {name!r} but {module} cannot be imported "
                    f"({reason}); pip install {package} (or remove {name} from {SECTION}.backends)"
                ) from None
