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

__all__ = ["Curve", "default_metrics", "eval_accuracies", "is_eval_dir", "load_curves", "moving_average", "plot_runs"]


class Curve:
    """One metric of one run: ``steps`` and ``values`` (same length), ``is_eval``."""

    def __init__(self, steps: list[int], values: list[float], is_eval: bool):
        self.steps, self.values, self.is_eval = steps, values, is_eval


def _read_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise DareError(
            f"{run_dir} has neither metrics.jsonl nor results.json; pass a run directory `dare train` "
            "printed (output_dir/run_name) or an evaluation directory `dare eval` wrote"
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


def is_eval_dir(path: str) -> bool:
    """Whether ``path`` is an evaluation directory of ``dare eval`` (``results.json``, no
    ``metrics.jsonl``)."""
    return os.path.isfile(os.path.join(path, "results.json")) and not os.path.isfile(
        os.path.join(path, "metrics.jsonl")
    )


def eval_accuracies(eval_dir: str) -> dict[str, float]:
    """``{task: accuracy}`` of an evaluation directory's ``results.json``."""
    path = os.path.join(eval_dir, "results.json")
    try:
        with open(path) as fh:
            tasks = json.load(fh)["tasks"]
        return {name: float(m["accuracy"]) for name, m in tasks.items() if _numeric(m.get("accuracy"))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise DareError(f"{path} is not the results.json `dare eval` writes; the file is damaged") from None


def default_metrics(run_dir: str) -> list[str]:
    """The main metrics of a training run: its reward (RL) or its loss (SFT, preference), then
    ``eval.accuracy`` when it was evaluated."""
    names = set(available_metrics(run_dir))
    main = next((m for m in MAIN_METRICS if m in names), None)
    return [m for m in (main, "eval.accuracy") if m is not None and m in names]


#: a training run's main metric, the first it logs: RL's reward, else the supervised loss
MAIN_METRICS = ("reward", "loss")


def available_metrics(run_dir: str) -> list[str]:
    """Every numeric metric of a training run (``eval.<field>`` for evaluation fields)."""
    rows = _read_rows(run_dir)
    return sorted(
        {k for r in rows if "eval" not in r for k, v in r.items() if k != "step" and _numeric(v)}
        | {f"eval.{k}" for r in rows if isinstance(r.get("eval"), dict) for k, v in r["eval"].items() if _numeric(v)}
    )


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load_curves(run_dir: str, metrics: Sequence[str]) -> dict[str, Curve]:
    """The requested metrics of one run (``eval.<field>`` for evaluation fields).

    :raises DareError: one line listing the run's metrics when one is missing.
    """
    rows = _read_rows(run_dir)
    train = [r for r in rows if "eval" not in r]
    evals = [r for r in rows if isinstance(r.get("eval"), dict)]
    available = available_metrics(run_dir)
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
    """Draw ``metrics`` (one panel each) of every training run, and the accuracy per task of
    every evaluation directory (one bar panel), into the PNG ``out``; returns ``out``.

    ``metrics`` empty: each training run's main metrics (:func:`default_metrics`: reward or
    loss, and ``eval.accuracy``), a panel drawing the runs that have its metric. A metric given
    by name must exist in every training run.
    """
    if not run_dirs:
        raise DareError("give at least one run directory")
    if labels and len(labels) != len(run_dirs):
        raise DareError(f"{len(labels)} --label for {len(run_dirs)} runs; give one per run or none")
    if smooth < 1:
        raise DareError(f"--smooth must be >= 1, got {smooth}")
    names = dict(zip(run_dirs, labels)) if labels else {d: _label(d) for d in run_dirs}
    evals = {d: eval_accuracies(d) for d in run_dirs if is_eval_dir(d)}  # errors before matplotlib
    runs = [d for d in run_dirs if d not in evals]
    if metrics:
        panels = list(metrics)
        curves = {d: load_curves(d, metrics) for d in runs}
    else:
        wanted = {d: default_metrics(d) for d in runs}
        panels = list(dict.fromkeys(m for d in runs for m in wanted[d]))
        curves = {d: load_curves(d, wanted[d]) for d in runs}
    plt = _pyplot()
    rows = len(panels) + (1 if evals else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(7, 2.6 * rows + 0.6), squeeze=False)
    for row, metric in enumerate(panels):
        drawn = {names[d]: curves[d][metric] for d in runs if metric in curves[d]}
        _draw_curves(axes[row][0], metric, drawn, smooth)
    if evals:
        _draw_eval_bars(axes[-1][0], {names[d]: acc for d, acc in evals.items()})
    if panels:
        axes[len(panels) - 1][0].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        atomic_write_file(out, lambda tmp: fig.savefig(tmp, dpi=100, format="png"), suffix=".png")
    finally:
        plt.close(fig)
    return out


def _pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DareError("dare plot needs matplotlib; pip install matplotlib") from None
    return plt


def _draw_curves(ax, metric: str, curves: dict[str, Curve], smooth: int) -> None:
    """One panel: ``metric`` of each run (``{label: curve}``), smoothed training curves over the
    raw ones drawn faint, evaluation points as markers."""
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    smoothed = False
    for i, (name, c) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        if c.is_eval:
            ax.plot(c.steps, c.values, marker="o", color=color, label=name)
        elif smooth > 1:
            ax.plot(c.steps, c.values, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(c.steps, moving_average(c.values, smooth), color=color, label=name)
            smoothed = True
        else:
            ax.plot(c.steps, c.values, color=color, label=name)
    suffix = f" (moving average of {smooth})" if smoothed else ""
    ax.set_ylabel(metric)
    ax.set_title(metric + suffix, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _draw_eval_bars(ax, accuracies: dict[str, dict[str, float]]) -> None:
    """One panel of grouped bars: the accuracy of each task (x) in each evaluation directory."""
    tasks = list(dict.fromkeys(t for acc in accuracies.values() for t in acc))
    width = 0.8 / max(1, len(accuracies))
    for i, (name, acc) in enumerate(accuracies.items()):
        xs = [j + i * width for j, t in enumerate(tasks) if t in acc]
        ax.bar(xs, [acc[t] for t in tasks if t in acc], width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks, fontsize=8)
    ax.set_ylabel("accuracy")
    ax.set_title("held-out accuracy by task (evaluation directories)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
