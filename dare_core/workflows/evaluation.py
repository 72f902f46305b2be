"""Held-out evaluation: generate with the evaluation sampler, score with the task, write samples;
a progress bar on stderr (rank 0, ``progress``, only when stderr is a terminal)."""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import torch
from tqdm import tqdm

from dare_core.interfaces import Example
from dare_core.workflows.batching import chunks, decode_responses, encode_prompts, left_pad
from dare_core.workflows.runtime import Context


def evaluate(ctx: Context, examples: Sequence[Example], label: str,
             items: Optional[list[float]] = None) -> dict[str, Any]:
    """Generate for ``examples`` with the eval sampling config (each rank for every world-size-th
    item) and score them; returns ``{"accuracy", "reward", "n", "nfe", "seconds"}``, writes decoded
    samples and appends the per-item accuracies (every rank's, in order) to ``items`` if given."""
    cfg = ctx.config
    wrapper = ctx.wrapper
    rank, world = ctx.engine.rank, ctx.engine.world_size
    shard = list(examples)[rank::world]
    prompts = encode_prompts(wrapper, shard, cfg.trainer.max_prompt_length)
    gen = torch.Generator().manual_seed(cfg.seed + 7919)
    accs: list[float] = []
    scores: list[float] = []
    samples: list[dict[str, Any]] = []
    nfe = 0
    start = time.perf_counter()
    device = wrapper.device
    bar = tqdm(total=len(shard), desc=label if label == "eval" else f"eval {label}", unit="prompt", leave=False,
               dynamic_ncols=True, disable=None if cfg.progress and ctx.engine.is_main else True)  # None: TTY only
    for sl in chunks(len(shard), cfg.eval.batch_size):
        ids, mask = left_pad(prompts[sl], wrapper.pad_token_id)
        with ctx.engine.autocast():
            roll = ctx.eval_rollout.generate(wrapper, ids.to(device), mask.to(device), generator=gen)
        nfe += roll.nfe
        texts = decode_responses(wrapper, roll.response_ids.cpu(), roll.response_mask.cpu())
        for ex, text in zip(shard[sl], texts):
            s = ctx.task.score(ex, text)
            accs.append(float(s.acc))
            scores.append(float(s.score))
            if len(samples) < cfg.eval.save_samples:
                samples.append({"prompt": ex.prompt[-1]["content"][-200:], "response": text,
                                "ground_truth": ex.ground_truth, "score": s.score, "acc": s.acc})
        bar.update(len(texts))
    bar.close()
    seconds = time.perf_counter() - start
    # every item's (position, acc, score), in the order of ``examples`` on every rank
    scored = sorted(ctx.engine.gather([(rank + world * i, a, s) for i, (a, s) in enumerate(zip(accs, scores))]))
    accs, scores = [a for _, a, _ in scored], [s for _, _, s in scored]
    n = len(accs)
    if items is not None:
        items.extend(accs)
    result = {"accuracy": sum(accs) / max(1, n), "reward": sum(scores) / max(1, n), "n": n,
              "nfe": nfe, "seconds": round(seconds, 2)}
    samples = ctx.engine.gather(samples)[: cfg.eval.save_samples]
    if ctx.rundir is not None and ctx.engine.is_main:
        ctx.rundir.write_json(f"eval_samples/{label}.json", samples)
    return result
