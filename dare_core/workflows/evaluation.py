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


def evaluate(ctx: Context, examples: Sequence[Example], label: str, items: Optional[list[float]] = None,
             records: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """Generate for ``examples`` with the eval sampling config (each rank for every world-size-th
    item) and score them; returns ``{"accuracy", "reward", "n", "nfe", "seconds"}`` (``nfe``: this
    rank's), writes decoded samples and appends, every rank's in the order of ``examples``, the
    per-item accuracies to ``items`` and ``{"response", "pred", "score", "acc", "kind"}`` to
    ``records`` where given."""
    cfg = ctx.config
    wrapper = ctx.wrapper
    rank, world = ctx.engine.rank, ctx.engine.world_size
    shard = list(examples)[rank::world]
    prompts = encode_prompts(wrapper, shard, cfg.trainer.max_prompt_length)
    gen = torch.Generator().manual_seed(cfg.seed + 7919)
    done: list[tuple] = []  # (position in examples, acc, score, record)
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
            rec = None if records is None else {"response": text, "pred": s.pred, "score": float(s.score),
                                                "acc": float(s.acc), "kind": s.kind}
            done.append((rank + world * len(done), float(s.acc), float(s.score), rec))
            if len(samples) < cfg.eval.save_samples:
                samples.append({"prompt": ex.prompt[-1]["content"][-200:], "response": text,
                                "ground_truth": ex.ground_truth, "score": s.score, "acc": s.acc})
        bar.update(len(texts))
    bar.close()
    seconds = time.perf_counter() - start
    scored = sorted(ctx.engine.gather(done), key=lambda t: t[0])  # every rank's, in order
    accs, scores = [t[1] for t in scored], [t[2] for t in scored]
    n = len(accs)
    if items is not None:
        items.extend(accs)
    if records is not None:
        records.extend(t[3] for t in scored)
    result = {"accuracy": sum(accs) / max(1, n), "reward": sum(scores) / max(1, n), "n": n,
              "nfe": nfe, "seconds": round(seconds, 2)}
    samples = ctx.engine.gather(samples)[: cfg.eval.save_samples]
    if ctx.rundir is not None and ctx.engine.is_main:
        ctx.rundir.write_json(f"eval_samples/{label}.json", samples)
    return result
