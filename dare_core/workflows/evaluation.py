"""Held-out evaluation: generate with the evaluation sampler, score with the task, write samples;
a progress bar on stderr (rank 0, ``progress``, only when stderr is a terminal)."""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from tqdm import tqdm

from dare_core.console import quiet
from dare_core.engines.lockstep import lockstep
from dare_core.interfaces import Example
from dare_core.workflows.batching import chunks, decode_responses, encode_prompts, left_pad
from dare_core.workflows.runtime import Context

#: the key of evaluation's random streams within the run seed (:meth:`Context.stream`)
STREAM_EVAL = 7919


def evaluate(
    ctx: Context,
    examples: Sequence[Example],
    label: str,
    items: Optional[list[float]] = None,
    records: Optional[list[dict[str, Any]]] = None,
) -> dict[str, Any]:
    """Generate for ``examples`` with the eval sampling config and score them; returns ``{"accuracy",
    "reward", "n", "nfe", "seconds"}`` (``nfe``: forwards of the counted batches, summed over
    ranks), writes decoded samples and appends, in the order of ``examples``, the per-item
    accuracies to ``items`` and ``{"response", "pred", "score", "acc", "kind"}`` to ``records``.

    The items form global batches of ``eval.batch_size`` (the same on every world size); rank ``r``
    generates batches ``r, r + W, ...``, padded with a one-row batch that never counts so that every
    rank makes the same generate calls (in lockstep where forwards are collective). Batch ``j``
    samples from the stream ``(STREAM_EVAL, j)`` of the run seed: results do not depend on the
    world size."""
    cfg = ctx.config
    wrapper, engine = ctx.wrapper, ctx.engine
    size = cfg.eval.batch_size
    examples = list(examples)
    prompts = encode_prompts(wrapper, examples, cfg.trainer.max_prompt_length)
    batches = list(chunks(len(examples), size))
    padded = len(batches) + -len(batches) % engine.world_size  # every rank as many calls
    mine = [(j, batches[j] if j < len(batches) else None) for j in range(engine.rank, padded, engine.world_size)]
    done: list[tuple] = []  # (position in examples, acc, score, record, sample)
    nfe = 0
    start = time.perf_counter()
    device = wrapper.device
    bar = _progress(ctx, sum(sl.stop - sl.start for _, sl in mine if sl is not None), label)
    for j, sl in mine:
        ids, mask = left_pad(prompts[sl or slice(0, 1)], wrapper.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        with engine.autocast(), lockstep(engine, wrapper, ids, mask):
            roll = ctx.eval_rollout.generate(wrapper, ids, mask, generator=ctx.stream(STREAM_EVAL, j))
        if sl is None:  # padding: generated in step with the other ranks, never counted
            continue
        nfe += roll.nfe
        texts = decode_responses(wrapper, roll.response_ids.cpu(), roll.response_mask.cpu())
        done.extend(_score(ctx, examples, sl, texts, records is not None))
        bar.update(len(texts))
    bar.close()
    seconds = time.perf_counter() - start
    scored = sorted(engine.gather(done), key=lambda t: t[0])  # every rank's, in order
    accs, scores = [t[1] for t in scored], [t[2] for t in scored]
    n = len(accs)
    if items is not None:
        items.extend(accs)
    if records is not None:
        records.extend(t[3] for t in scored)
    result = {
        "accuracy": sum(accs) / max(1, n),
        "reward": sum(scores) / max(1, n),
        "n": n,
        "nfe": sum(engine.gather([nfe])),
        "seconds": round(seconds, 2),
    }
    if ctx.rundir is not None and engine.is_main:
        ctx.rundir.write_json(f"eval_samples/{label}.json", [t[4] for t in scored if t[4] is not None])
    return result


def _progress(ctx: Context, total: int, label: str) -> tqdm:
    """The evaluation's progress bar: rank 0, ``progress``, only when stderr is a terminal."""
    return tqdm(
        total=total,
        desc=label if label == "eval" else f"eval {label}",
        unit="prompt",
        leave=False,
        dynamic_ncols=True,
        disable=None if ctx.config.progress and ctx.engine.is_main and not quiet() else True,
    )  # None: TTY only


def _score(ctx: Context, examples: Sequence[Example], sl: slice, texts: list[str], keep: bool) -> list[tuple]:
    """``(position, acc, score, record, sample)`` of the items ``examples[sl]`` answered with ``texts``;
    ``record`` only when ``keep``, ``sample`` for the first ``eval.save_samples`` positions."""
    out = []
    for i, (ex, text) in enumerate(zip(examples[sl], texts), start=sl.start):
        s = ctx.task.score(ex, text)
        rec = (
            {"response": text, "pred": s.pred, "score": float(s.score), "acc": float(s.acc), "kind": s.kind}
            if keep
            else None
        )
        sample = (
            None
            if i >= ctx.config.eval.save_samples
            else {
                "prompt": ex.prompt[-1]["content"][-200:],
                "response": text,
                "ground_truth": ex.ground_truth,
                "score": s.score,
                "acc": s.acc,
            }
        )
        out.append((i, float(s.acc), float(s.score), rec, sample))
    return out
