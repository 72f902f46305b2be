"""The bookkeeping every loop shares (:class:`Tracker`): resume, evaluations before / every N / after
with the paired comparison to the first, metric lines, the observer hooks, the progress bar, the
divergence guard, checkpoints and the final export (:mod:`dare_core.workflows.checkpoint`).

``metrics.jsonl`` and ``summary.json`` are strict JSON: a non-finite number (NaN, ±inf) is written
as ``null`` and its key (dotted inside a nested record) is listed in the record's ``nonfinite``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence, cast

import torch

from dare_core.console import quiet
from dare_core.errors import DareError, DivergenceError, Preempted
from dare_core.interfaces import Example
from dare_core.pairing import compare, describe, paired_counts
from dare_core.workflows.checkpoint import TRAINER_STATE, save_final, save_training_checkpoint, set_rng_state
from dare_core.workflows.evaluation import evaluate
from dare_core.workflows.runtime import Context

if TYPE_CHECKING:
    from tqdm import tqdm

    from dare_core.rundir import RunDir

#: the console line of a step (a loop may pass its own): the keys the record has, in this order
LINE = ("loss", "grad_norm", "time_step")


def strict(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``record`` with each non-finite float as ``None``, its key (dotted when nested) listed
    under ``nonfinite``."""
    out: dict[str, Any] = {}
    bad: list[str] = []
    for k, v in record.items():
        if isinstance(v, dict):
            v = strict(v, f"{prefix}{k}.")
            bad += v.pop("nonfinite", [])
        elif isinstance(v, float) and not math.isfinite(v):
            bad, v = bad + [prefix + k], None
        out[k] = v
    return {**out, "nonfinite": bad} if bad else out


class StopSignals:
    """The run's stop signals (``trainer.stop_signals``): while installed, each records the first
    one received (``requested``, its name); the run stops after the step it arrives in."""

    def __init__(self) -> None:
        self.requested: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def install(self, names: Sequence[str]) -> None:
        """Handle ``names`` (signal handlers live in the main thread: elsewhere, none)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for name in names:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._record)

    def _record(self, signum: int, _frame: Any) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name

    def restore(self) -> None:
        """The handlers before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Tracker:
    """The bookkeeping every loop shares (see the module docstring). A loop calls ``start =
    tracker.begin()`` after ``engine.setup_optimizer`` and runs steps ``start .. trainer.steps``,
    drawing its batches from the :class:`BatchStream` it gave here; ``history`` holds the step records."""

    def __init__(self, ctx: Context, eval_examples: Sequence[Example], data: Any = None):
        self.ctx = ctx
        self.eval_examples = eval_examples
        self.data = data
        self.summary: dict[str, Any] = {"eval": {}}
        self.bar: Optional[tqdm] = None
        self.before_items: Optional[list[float]] = None
        self.history: list[dict[str, Any]] = []
        self.nonfinite = 0  # consecutive steps with a non-finite loss or gradient norm
        self.stop = StopSignals()

    def log(self, record: dict[str, Any]) -> None:
        if self.ctx.rundir is not None and self.ctx.engine.is_main:
            self.ctx.rundir.log_metrics(strict(record))

    def evaluate(self, label: str, step: int) -> dict[str, Any]:
        ctx = self.ctx
        ctx.log(f"evaluating on {len(self.eval_examples)} held-out prompts ({label}) ...")
        was_training = ctx.wrapper.module.training
        items: list[float] = []
        res = evaluate(ctx, self.eval_examples, label, items)
        ctx.wrapper.module.train(was_training)
        line = f"eval {label}: accuracy={res['accuracy']:.3f} reward={res['reward']:.3f}"
        if label == "before":
            self.before_items = items
        elif self.before_items is not None:  # same items, same sampler: a paired comparison
            res["vs_before"] = compare(*paired_counts(self.before_items, items), res["n"])
            line += f" ({describe(res['vs_before'])})"
        ctx.log(line)
        self.log({"step": step, "eval": res})
        if ctx.engine.is_main:
            ctx.dare.pm.hook.dare_on_eval(step=step, label=label, metrics=strict(res))
        return res

    def begin(self) -> int:
        """Restore the checkpoint the run resumes from, or evaluate before training (if
        configured); show the progress bar. Returns the first step to run."""
        ctx = self.ctx
        cfg = ctx.config
        done = 0
        if ctx.resume_from is not None:
            done = self._restore(ctx.resume_from)
        elif cfg.eval.before:
            self.summary["eval"]["before"] = self.evaluate("before", 0)
        self.stop.install(cfg.trainer.stop_signals)
        if cfg.progress and ctx.engine.is_main and not quiet():
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.trainer.steps,
                initial=done,
                desc=cfg.algo,
                unit="step",
                dynamic_ncols=True,
                disable=None,  # a terminal only: no bar frames in a redirected log
            )
        return done + 1

    def step_end(self, step: int, record: dict[str, Any], line: Sequence[str] = LINE, **postfix: str) -> dict[str, Any]:
        """Log the step's ``record`` (reduced over ranks), print its ``line`` keys every
        ``trainer.log_every`` steps, guard against divergence, evaluate and checkpoint when due."""
        ctx = self.ctx
        cfg = ctx.config
        raw = ctx.engine.reduce_mean(record)
        record = strict(raw)
        self.log(record)
        self.history.append(record)
        ctx.dare.pm.hook.dare_on_step_end(step=step, metrics=record)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(dict(sorted(postfix.items())))  # as tqdm orders keyword postfixes
        if step % cfg.trainer.log_every == 0:
            ctx.log(" ".join([f"step {step}"] + [f"{k}={raw[k]:.4g}" for k in line if k in raw]))
        self._guard(step, raw)
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.trainer.steps:
            self.evaluate(f"step-{step}", step)
        saved = cfg.trainer.save_every and step % cfg.trainer.save_every == 0 and ctx.rundir is not None
        if saved:
            self.checkpoint(step)
        if step < cfg.trainer.steps and ctx.engine.any_active(self.stop.requested is not None):
            self._preempt(step, saved=bool(saved))
        return record

    def _preempt(self, step: int, saved: bool) -> None:
        """Stop after ``step`` on a stop signal (any rank's: every rank decides the same), with its
        training checkpoint written."""
        self.stop.restore()
        if self.ctx.rundir is not None and not saved:
            self.checkpoint(step)
        raise Preempted(
            f"stopped after step {step} of {self.ctx.config.trainer.steps} by "
            f"{self.stop.requested or 'a stop signal on another rank'}, its training checkpoint "
            "written; continue with trainer.resume=auto and the same run_name"
        )

    def _guard(self, step: int, record: dict[str, Any]) -> None:
        """Report a step whose loss or gradient norm is not finite; stop the run at
        ``trainer.max_nonfinite_steps`` of them in a row. ``record`` is reduced over ranks (a
        non-finite value on one rank is one on all), so every rank decides the same."""
        bad = [k for k in ("loss", "grad_norm") if not math.isfinite(record.get(k, 0.0))]
        self.nonfinite = self.nonfinite + 1 if bad else 0
        limit = self.ctx.config.trainer.max_nonfinite_steps
        if bad:
            self.ctx.log(
                f"step {step}: non-finite {', '.join(f'{k}={record[k]}' for k in bad)}; update "
                f"{'skipped' if record.get('skipped_steps') else 'applied'} "
                f"({self.nonfinite} of {limit} in a row)"
            )
        if self.nonfinite >= limit:
            self.stop.restore()
            if self.bar is not None:
                self.bar.close()
            raise DivergenceError(
                f"training diverged at step {step}: non-finite {' and '.join(bad)} for {limit} steps in a "
                f"row; lower trainer.lr, check the data, or raise trainer.max_nonfinite_steps"
            )

    def checkpoint(self, step: int) -> str:
        """Write the training checkpoint of ``step`` (collective)."""
        ctx = self.ctx
        rundir = cast("RunDir", ctx.rundir)  # step_end checkpoints only a run with a run directory
        lines = rundir.metrics_lines() if ctx.engine.is_main else 0
        trainer_state = {
            "summary": self.summary,
            "before_items": self.before_items,
            "metrics_lines": lines,
            "nonfinite": self.nonfinite,
        }
        rank_state = {
            "data": self.data.state_dict() if self.data is not None else None,
            "generator": ctx.generator.get_state(),
        }
        return save_training_checkpoint(ctx, step, trainer_state, rank_state)

    def _restore(self, path: str) -> int:
        ctx = self.ctx
        with open(os.path.join(path, TRAINER_STATE)) as fh:
            state = json.load(fh)
        if state["world_size"] != ctx.engine.world_size and not ctx.engine.reshards_state:
            raise DareError(
                f"trainer.resume: {path} was written by {state['world_size']} processes, "
                f"this run has {ctx.engine.world_size}; the {ctx.engine.name} engine cannot "
                f"reshard its state: resume with {state['world_size']} processes"
            )
        ctx.engine.load_state(os.path.join(path, "state"))
        # a rank the checkpoint's run did not have takes rank 0's data position and streams
        own = os.path.join(path, f"rank-{ctx.engine.rank}.pt")
        rank = torch.load(own if os.path.isfile(own) else os.path.join(path, "rank-0.pt"), weights_only=False)
        if self.data is not None:
            self.data.load_state_dict(rank["data"])
        ctx.generator.set_state(rank["generator"])
        set_rng_state(rank["rng"])
        self.summary, self.before_items = state["summary"], state["before_items"]
        self.nonfinite = state.get("nonfinite", 0)
        if ctx.engine.is_main and ctx.rundir is not None:
            self.history = [r for r in ctx.rundir.truncate_metrics(state["metrics_lines"]) if "eval" not in r]
        ctx.log(f"resumed from {path} (step {state['step']})")
        return int(state["step"])

    def finish(self, train_summary: dict[str, Any]) -> dict[str, Any]:
        cfg = self.ctx.config
        self.stop.restore()
        if self.bar is not None:
            self.bar.close()
        if cfg.eval.after:
            self.summary["eval"]["after"] = self.evaluate("after", cfg.trainer.steps)
        if cfg.trainer.save_final:
            self.summary["final_checkpoint"] = save_final(self.ctx)
        self.summary["train"] = strict(train_summary)
        self.summary["eval"] = {k: strict(v) for k, v in self.summary["eval"].items()}
        return self.summary

    def last(self, key: str, n: int) -> float:
        """The mean of the finite values of ``key`` over the last ``n`` logged steps (0 when none)."""
        values = [r[key] for r in self.history[-n:] if r.get(key) is not None]
        return sum(values) / len(values) if values else 0.0
