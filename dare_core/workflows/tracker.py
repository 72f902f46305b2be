"""The bookkeeping every loop shares (:class:`Tracker`): evaluations before / every N / after with
the paired comparison to the first, metric lines, the observer hooks, the progress bar and
checkpoints."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from dare_core.interfaces import Example
from dare_core.pairing import compare, describe, paired_counts
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
    """The bookkeeping every loop shares: evaluation before / every N / after, metric lines,
    the step-end and eval hooks, the progress bar, periodic and final checkpoints."""

    def __init__(self, ctx: Context, eval_examples: Sequence[Example]):
        self.ctx = ctx
        self.eval_examples = eval_examples
        self.summary: dict[str, Any] = {"eval": {}}
        self.bar = None
        self.before_items: Optional[list[float]] = None

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
            counts = ctx.engine.reduce_mean(dict(zip(("gained", "lost"), paired_counts(self.before_items, items))))
            res["vs_before"] = compare(*(round(counts[k] * ctx.engine.world_size) for k in ("gained", "lost")),
                                       res["n"])
            line += f" ({describe(res['vs_before'])})"
        ctx.log(line)
        self.log({"step": step, "eval": res})
        if ctx.engine.is_main:
            ctx.dare.pm.hook.dare_on_eval(step=step, label=label, metrics=dict(res))
        return res

    def begin(self) -> None:
        """Evaluate before training (if configured), then show the progress bar."""
        ctx = self.ctx
        cfg = ctx.config
        if cfg.eval.before:
            self.summary["eval"]["before"] = self.evaluate("before", 0)
        if cfg.progress and ctx.engine.is_main:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=cfg.trainer.steps, desc=cfg.algo, unit="step", dynamic_ncols=True)
            except ImportError:  # pragma: no cover
                self.bar = None

    def step_end(self, step: int, record: dict[str, Any], **postfix: str) -> dict[str, Any]:
        ctx = self.ctx
        cfg = ctx.config
        record = ctx.engine.reduce_mean(record)
        self.log(record)
        ctx.dare.pm.hook.dare_on_step_end(step=step, metrics=record)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(**postfix)
        if step % cfg.trainer.log_every == 0:
            ctx.log(_fmt(record))
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.trainer.steps:
            self.evaluate(f"step-{step}", step)
        if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
            self.save(f"checkpoints/step-{step}")
        return record

    def save(self, name: str) -> Optional[str]:
        if self.ctx.rundir is None or not self.ctx.engine.is_main:
            return None
        from dare_core.config.loader import PRESET_FILE

        # a saved model keeps the run presets of the checkpoint it started from
        preset = os.path.join(str(self.ctx.config.model.path), PRESET_FILE)
        from dare_core.models import lora

        if lora.is_lora(self.ctx.wrapper):  # the adapter (PEFT layout), merged weights on request
            merge = self.ctx.config.model.lora.merge_on_save
            return self.ctx.rundir.save_model(
                self.ctx.wrapper, name, extra_files=(preset,),
                writer=lambda w, tmp: lora.save_checkpoint(w, tmp, merge=merge))
        return self.ctx.rundir.save_model(self.ctx.wrapper, name, extra_files=(preset,))

    def finish(self, train_summary: dict[str, Any]) -> dict[str, Any]:
        cfg = self.ctx.config
        if self.bar is not None:
            self.bar.close()
        if cfg.eval.after:
            self.summary["eval"]["after"] = self.evaluate("after", cfg.trainer.steps)
        if cfg.trainer.save_final:
            self.summary["final_checkpoint"] = self.save("final")
        self.summary["train"] = train_summary
        return self.summary
