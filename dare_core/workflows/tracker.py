"""The bookkeeping every loop shares (:class:`Tracker`): evaluations before / every N / after with
the paired comparison to the first, metric lines, the observer hooks, the progress bar and
checkpoints (:mod:`dare_core.workflows.checkpoint`)."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import torch

from dare_core.errors import DareError
from dare_core.interfaces import Example
from dare_core.pairing import compare, describe, paired_counts
from dare_core.workflows.checkpoint import TRAINER_STATE, save_final, save_training_checkpoint, set_rng_state
from dare_core.workflows.evaluation import evaluate
from dare_core.workflows.runtime import Context


def _fmt(record: dict[str, Any]) -> str:
    keys = ("reward", "accuracy", "loss", "grad_norm", "pg_clipfrac", "ppo_kl", "time_rollout",
            "time_update", "time_step")
    parts = [f"step {record['step']}"]
    for k in keys:
        if k in record:
            parts.append(f"{k}={record[k]:.4g}")
    return " ".join(parts)


class Tracker:
    """The bookkeeping every loop shares: resume or evaluation before training, evaluation every
    N steps and after, metric lines (``history``), the step-end and eval hooks, the progress bar,
    training checkpoints and the final export.

    A loop calls ``start = tracker.begin()`` after ``engine.setup_optimizer`` and runs steps
    ``start .. trainer.steps``, drawing its batches from the :class:`BatchStream` it gave here.
    """

    def __init__(self, ctx: Context, eval_examples: Sequence[Example], data: Any = None):
        self.ctx = ctx
        self.eval_examples = eval_examples
        self.data = data
        self.summary: dict[str, Any] = {"eval": {}}
        self.bar = None
        self.before_items: Optional[list[float]] = None
        self.history: list[dict[str, Any]] = []

    def log(self, record: dict[str, Any]) -> None:
        if self.ctx.rundir is not None and self.ctx.engine.is_main:
            self.ctx.rundir.log_metrics(record)

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
            ctx.dare.pm.hook.dare_on_eval(step=step, label=label, metrics=dict(res))
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
        if cfg.progress and ctx.engine.is_main:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.trainer.steps, initial=done, desc=cfg.algo, unit="step",
                            dynamic_ncols=True)
        return done + 1

    def step_end(self, step: int, record: dict[str, Any], **postfix: str) -> dict[str, Any]:
        ctx = self.ctx
        cfg = ctx.config
        record = ctx.engine.reduce_mean(record)
        self.log(record)
        self.history.append(record)
        ctx.dare.pm.hook.dare_on_step_end(step=step, metrics=record)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(**postfix)
        if step % cfg.trainer.log_every == 0:
            ctx.log(_fmt(record))
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.trainer.steps:
            self.evaluate(f"step-{step}", step)
        if cfg.trainer.save_every and step % cfg.trainer.save_every == 0 and ctx.rundir is not None:
            self.checkpoint(step)
        return record

    def checkpoint(self, step: int) -> str:
        """Write the training checkpoint of ``step`` (collective)."""
        ctx = self.ctx
        lines = ctx.rundir.metrics_lines() if ctx.engine.is_main else 0
        trainer_state = {"summary": self.summary, "before_items": self.before_items, "metrics_lines": lines}
        rank_state = {"data": self.data.state_dict() if self.data is not None else None,
                      "generator": ctx.generator.get_state()}
        return save_training_checkpoint(ctx, step, trainer_state, rank_state)

    def _restore(self, path: str) -> int:
        ctx = self.ctx
        with open(os.path.join(path, TRAINER_STATE)) as fh:
            state = json.load(fh)
        if state["world_size"] != ctx.engine.world_size:
            raise DareError(f"trainer.resume: {path} was written by {state['world_size']} processes, "
                            f"this run has {ctx.engine.world_size}; resume with the same world size")
        ctx.engine.load_state(os.path.join(path, "state"))
        rank = torch.load(os.path.join(path, f"rank-{ctx.engine.rank}.pt"), weights_only=False)
        if self.data is not None:
            self.data.load_state_dict(rank["data"])
        ctx.generator.set_state(rank["generator"])
        set_rng_state(rank["rng"])
        self.summary, self.before_items = state["summary"], state["before_items"]
        if ctx.engine.is_main and ctx.rundir is not None:
            self.history = [r for r in ctx.rundir.truncate_metrics(state["metrics_lines"]) if "eval" not in r]
        ctx.log(f"resumed from {path} (step {state['step']})")
        return int(state["step"])

    def finish(self, train_summary: dict[str, Any]) -> dict[str, Any]:
        cfg = self.ctx.config
        if self.bar is not None:
            self.bar.close()
        if cfg.eval.after:
            self.summary["eval"]["after"] = self.evaluate("after", cfg.trainer.steps)
        if cfg.trainer.save_final:
            self.summary["final_checkpoint"] = save_final(self.ctx)
        self.summary["train"] = train_summary
        return self.summary

    def last(self, key: str, n: int) -> float:
        """The mean of ``key`` over the last ``n`` logged steps (0 when none)."""
        values = [r[key] for r in self.history[-n:] if key in r]
        return sum(values) / len(values) if values else 0.0
