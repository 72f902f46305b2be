"""The run directory: resolved config, metrics, plugin versions, checkpoints, summary.

Layout::

    <output_dir>/<run_name>/
        config.yaml        resolved config (reload with --config)
        plugins.json       plugins in use: name, distribution, version, hooks
        metrics.jsonl      one JSON object per step / evaluation
        eval_samples/      decoded evaluation samples
        checkpoints/step-N/  training checkpoints: the HF-layout model, engine state, trainer
                           state (:mod:`dare_core.workflows.checkpoint`)
        final/             the final model in HF layout
        summary.json       algo, model, task, eval.before / eval.after, timings

Every file and checkpoint directory is written atomically (temp file or directory, then
``os.replace``), so an interrupted run never leaves a half-written checkpoint or summary behind;
the temp entries (``.tmp-*``) it may leave are removed when the run is continued or replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

import yaml

from dare_core.errors import DareError


def _umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_file(path: str, write: Callable[[str], None], suffix: str = "") -> None:
    """Call ``write(tmp_path)`` on a temp file next to ``path`` (``suffix`` kept, e.g. for
    writers that pick the format from it), then move it to ``path``; on failure the temp file is
    removed and an existing ``path`` is untouched. The file gets the permissions of a plain
    ``open()``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; match a plain open()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def fsync_dir(path: str) -> None:
    """Flush a directory's entries (a rename into it survives a crash)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover (platforms without directory descriptors)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write_file(path, write)


class RunDir:
    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self._metrics = os.path.join(root, "metrics.jsonl")

    @classmethod
    def create(
        cls, output_dir: str, run_name: Optional[str], default_name: str, *, overwrite: bool = False
    ) -> "RunDir":
        """Claim a new run directory with an exclusive ``mkdir`` (two runs never share one):
        ``output_dir/run_name``, refused when it exists (``overwrite``: a run directory there, empty or
        with ``config.yaml``, is removed first), else ``<default_name>-<YYYYmmdd-HHMMSS>[-N]``."""
        os.makedirs(output_dir, exist_ok=True)
        base = os.path.join(output_dir, run_name or f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if run_name and overwrite and os.path.lexists(base):
            if not os.path.isdir(base) or (os.listdir(base) and not os.path.isfile(os.path.join(base, "config.yaml"))):
                raise DareError(
                    f"--overwrite: {base} is no run directory (no config.yaml); it is left alone: "
                    f"choose another run_name"
                )
            shutil.rmtree(base)
        root, suffix = base, 0
        while True:
            try:
                os.mkdir(root)
                return cls(root)
            except FileExistsError:
                if run_name:
                    raise DareError(
                        f"run directory {root} exists; choose another run_name, pass --overwrite to "
                        f"replace it, or continue it with trainer.resume=auto"
                    ) from None
                suffix += 1
                root = f"{base}-{suffix}"

    def remove_temp(self) -> None:
        """Remove the temp files and directories (``.tmp-*``) a save cut off by a crash left."""
        for top, dirs, files in os.walk(self.root):
            for name in [n for n in dirs + files if n.startswith(".tmp-")]:
                path = os.path.join(top, name)
                shutil.rmtree(path, ignore_errors=True) if name in dirs else os.unlink(path)
            dirs[:] = [d for d in dirs if not d.startswith(".tmp-")]

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def write_config(self, data: dict[str, Any]) -> None:
        atomic_write_text(self.path("config.yaml"), yaml.safe_dump(data, sort_keys=False))

    def write_json(self, name: str, data: Any) -> None:
        atomic_write_text(self.path(name), json.dumps(data, indent=2, sort_keys=False) + "\n")

    def log_metrics(self, record: dict[str, Any]) -> None:
        with open(self._metrics, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()

    def metrics_lines(self) -> int:
        """How many records ``metrics.jsonl`` holds."""
        if not os.path.isfile(self._metrics):
            return 0
        with open(self._metrics) as fh:
            return sum(1 for _ in fh)

    def truncate_metrics(self, lines: int) -> list[dict[str, Any]]:
        """Keep the first ``lines`` records of ``metrics.jsonl`` (those a resumed checkpoint had
        written; later ones are recomputed) and return them."""
        kept: list[str] = []
        if os.path.isfile(self._metrics):
            with open(self._metrics) as fh:
                kept = [line for _, line in zip(range(lines), fh)]
        atomic_write_text(self._metrics, "".join(kept))
        return [json.loads(line) for line in kept]
