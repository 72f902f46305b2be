"""Learning curves from run directories (``dare plot``).

Reads each run's ``metrics.jsonl`` (one JSON object per training step; evaluation rows carry an
``eval`` object) and draws one panel per metric, one line per run. Training metrics are plotted
per step, optionally smoothed with a trailing moving average (the raw values stay visible as a
faint line); evaluation metrics are named ``eval.<field>`` (e.g. ``eval.accuracy``) and drawn as
markers joined by a line. The PNG is written atomically.

matplotlib (a dependency of dare-plugin-report) is imported only when drawing, with the
non-interactive Agg backend.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from dare_core.api import DareError, atomic_write_file

__all__ = ["Curve", "load_curves", "moving_average", "plot_runs"]


class Curve:
    """One metric of one run: ``steps`` and ``values`` (same length), ``is_eval``."""

    def __init__(self, steps: list[int], values: list[float], is_eval: bool):
        self.steps, self.values, self.is_eval = steps, values, is_eval


def _read_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise DareError(
            f"{run_dir} has no metrics.jsonl; pass the run directory that `dare train` printed (output_dir/run_name)"
        )
    with open(path) as fh:
        lines = fh.read().splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # a run interrupted mid-write can leave a torn last line
                continue
            raise DareError(f"{path}:{n} is not valid JSON; the file is damaged") from None
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load_curves(run_dir: str, metrics: Sequence[str]) -> dict[str, Curve]:
    """The requested metrics of one run (``eval.<field>`` for evaluation fields).

    :raises DareError: one line listing the run's metrics when one is missing.
    """
    rows = _read_rows(run_dir)
    train = [r for r in rows if "eval" not in r]
    evals = [r for r in rows if isinstance(r.get("eval"), dict)]
    available = sorted(
        {k for r in train for k, v in r.items() if k != "step" and _numeric(v)}
        | {f"eval.{k}" for r in evals for k, v in r["eval"].items() if _numeric(v)}
    )
    out: dict[str, Curve] = {}
    for name in metrics:
        if name.startswith("eval."):
            field = name[len("eval.") :]
            pts = [(int(r["step"]), float(r["eval"][field])) for r in evals if _numeric(r["eval"].get(field))]
            is_eval = True
        else:
            pts = [(int(r["step"]), float(r[name])) for r in train if _numeric(r.get(name))]
            is_eval = False
        if not pts:
            raise DareError(
                f"run {run_dir} has no metric {name!r}; it has: {', '.join(available) or 'no numeric metrics'}"
            )
        out[name] = Curve([p[0] for p in pts], [p[1] for p in pts], is_eval)
    return out


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _label(run_dir: str) -> str:
    try:
        with open(os.path.join(run_dir, "summary.json")) as fh:
            s = json.load(fh)
        algo, model = s.get("algo"), s.get("model")
        if algo and model:
            return f"{algo} / {model} ({os.path.basename(os.path.normpath(run_dir))})"
    except (OSError, ValueError, AttributeError):
        pass
    return os.path.basename(os.path.normpath(run_dir))


def plot_runs(
    run_dirs: Sequence[str],
    metrics: Sequence[str],
    out: str,
    *,
    smooth: int = 1,
    labels: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
) -> str:
    """Draw ``metrics`` (one panel each) of every run into the PNG ``out``; returns ``out``."""
    if not run_dirs:
        raise DareError("give at least one run directory")
    if not metrics:
        raise DareError("give at least one --metric")
    if labels and len(labels) != len(run_dirs):
        raise DareError(f"{len(labels)} --label for {len(run_dirs)} runs; give one per run or none")
    if smooth < 1:
        raise DareError(f"--smooth must be >= 1, got {smooth}")
    curves = [load_curves(d, metrics) for d in run_dirs]  # errors before importing matplotlib
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DareError("dare plot needs matplotlib; pip install matplotlib") from None

    names = list(labels) if labels else [_label(d) for d in run_dirs]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(7, 2.6 * len(metrics) + 0.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, metric in enumerate(metrics):
        ax = axes[row][0]
        for i, (run, name) in enumerate(zip(curves, names)):
            c = run[metric]
            color = colors[i % len(colors)]
            if c.is_eval:
                ax.plot(c.steps, c.values, marker="o", color=color, label=name)
            elif smooth > 1:
                ax.plot(c.steps, c.values, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(c.steps, moving_average(c.values, smooth), color=color, label=name)
            else:
                ax.plot(c.steps, c.values, color=color, label=name)
        suffix = f" (moving average of {smooth})" if smooth > 1 and not run[metric].is_eval else ""
        ax.set_ylabel(metric)
        ax.set_title(metric + suffix, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1][0].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        atomic_write_file(out, lambda tmp: fig.savefig(tmp, dpi=100, format="png"), suffix=".png")
    finally:
        plt.close(fig)
    return out
