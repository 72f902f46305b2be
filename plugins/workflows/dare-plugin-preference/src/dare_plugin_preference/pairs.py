"""Preference pairs: loading UltraFeedback-style files and generating pairs from a model's own
rollouts.

A pair is a prompt (chat messages) with a preferred (``chosen``) and a dispreferred
(``rejected``) response text. Files are ``.parquet`` or ``.jsonl`` with the columns

* ``prompt``: a string (one user message) or a list of ``{role, content}`` messages;
* ``chosen`` / ``rejected``: a string, or a list of messages whose last ``assistant`` message is
  the response (the UltraFeedback-binarized layout, where the list repeats the prompt).

:func:`generate_pairs` makes pairs offline from a task with a reward rule: ``n`` sampled
rollouts per prompt are scored; the best-scoring rollout becomes ``chosen`` and the
worst-scoring one ``rejected`` when their scores differ (with ``require_correct``: chosen must
be fully correct and rejected not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import attrs
import torch

from dare_core.api import DareError, Example

PAIR_COLUMNS = ("prompt", "chosen", "rejected")


@attrs.define
class PreferencePair:
    """One preference pair.

    Attributes:
        prompt: chat messages ending with the user turn.
        chosen: the preferred response text.
        rejected: the dispreferred response text.
        meta: anything else (scores, source index), kept when pairs are saved.
    """

    prompt: list[dict[str, str]]
    chosen: str
    rejected: str
    meta: dict[str, Any] = attrs.field(factory=dict)

    def as_row(self) -> dict[str, Any]:
        return {
            "prompt": [dict(m) for m in self.prompt],
            "chosen": self.chosen,
            "rejected": self.rejected,
            "meta": json.dumps(self.meta, sort_keys=True),
        }


def _fail(path: str, problem: str) -> DareError:
    return DareError(f"{path}: {problem}")


def _messages(value: Any) -> Optional[list[dict[str, str]]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, Iterable) and not isinstance(value, (bytes, dict)):
        out = []
        for msg in value:
            if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
                return None
            out.append({"role": str(msg["role"]), "content": str(msg["content"])})
        return out or None
    return None


def _response(value: Any) -> Optional[str]:
    if isinstance(value, str):
        return value
    msgs = _messages(value)
    if not msgs:
        return None
    for msg in reversed(msgs):
        if msg["role"] == "assistant":
            return msg["content"]
    return None


def _prompt_of(value: Any, chosen: Any) -> Optional[list[dict[str, str]]]:
    prompt = _messages(value)
    if prompt is None and value is None:  # no prompt column value: the chosen conversation's head
        prompt = _messages(chosen)
        prompt = [m for m in (prompt or []) if m["role"] != "assistant"] or None
    if prompt is not None and not isinstance(value, str):
        # a conversation that ends with an assistant turn is not a prompt
        while prompt and prompt[-1]["role"] == "assistant":
            prompt = prompt[:-1]
    return prompt or None


def _rows(path: str, limit: Optional[int]) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise DareError(
            f"preference file not found: {path} (expected a .parquet or .jsonl file "
            f"with columns {', '.join(PAIR_COLUMNS)})"
        )
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
            missing = [c for c in PAIR_COLUMNS[1:] if c not in names]
            if missing:
                raise _fail(path, f"missing column(s) {', '.join(missing)}; expected {', '.join(PAIR_COLUMNS)}")
            cols = [c for c in (*PAIR_COLUMNS, "meta") if c in names]
            table = pq.read_table(path, columns=cols)
        except (pa.ArrowException, OSError) as exc:
            raise _fail(path, f"not a readable parquet file ({' '.join(str(exc).split())})") from None
        if limit is not None:
            table = table.slice(0, limit)
        return table.to_pylist()
    if suffix in (".jsonl", ".json"):
        rows = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if limit is not None and len(rows) >= limit:
                    break
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise _fail(path, f"line {lineno} is not valid JSON ({exc.msg})") from None
                    if not isinstance(row, dict):
                        raise _fail(path, f"line {lineno} is not a JSON object")
                    rows.append(row)
        return rows
    raise _fail(path, f"unsupported file type {suffix or '(none)'!r}; use .parquet or .jsonl")


def load_pairs(path: str, limit: Optional[int] = None) -> list[PreferencePair]:
    """Read preference pairs from ``path`` (see the module docstring for the columns)."""
    out = []
    for i, row in enumerate(_rows(str(path), limit)):
        chosen, rejected = _response(row.get("chosen")), _response(row.get("rejected"))
        prompt = _prompt_of(row.get("prompt"), row.get("chosen"))
        if prompt is None or chosen is None or rejected is None:
            bad = [k for k, v in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)) if v is None]
            raise _fail(
                str(path),
                f"row {i}: unreadable {', '.join(bad)} (prompt: string or "
                f"messages; chosen/rejected: string or messages ending with an "
                f"assistant turn)",
            )
        meta = row.get("meta")
        try:
            meta = json.loads(meta) if isinstance(meta, str) else (meta or {})
        except json.JSONDecodeError:
            meta = {"meta": meta}
        out.append(PreferencePair(prompt, chosen, rejected, dict(meta) if isinstance(meta, dict) else {}))
    return out


def save_pairs(path: str, pairs: Sequence[PreferencePair]) -> None:
    """Write pairs as a parquet file (atomically) that :func:`load_pairs` reads back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    table = (
        pa.Table.from_pylist([p.as_row() for p in pairs])
        if pairs
        else pa.table(
            {
                "prompt": pa.array([], pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                "chosen": pa.array([], pa.string()),
                "rejected": pa.array([], pa.string()),
                "meta": pa.array([], pa.string()),
            }
        )
    )
    from dare_core.api import atomic_write_file

    atomic_write_file(path, lambda tmp: pq.write_table(table, tmp), suffix=".parquet")


def pairs_from_scores(
    examples: Sequence[Example], texts: Sequence[str], scores: Sequence[Any], n: int, require_correct: bool = False
) -> list[PreferencePair]:
    """Turn ``n`` scored responses per example (example-major order) into at most one pair per
    example: the first best-scoring response is chosen, the first worst-scoring one rejected;
    examples whose responses all score the same give no pair. ``scores`` are
    :class:`~dare_core.interfaces.Score` objects."""
    pairs = []
    for i, ex in enumerate(examples):
        group = list(range(i * n, (i + 1) * n))
        vals = [float(scores[j].score) for j in group]
        best = group[max(range(n), key=lambda k: (vals[k], -k))]
        worst = group[min(range(n), key=lambda k: (vals[k], k))]
        if float(scores[best].score) <= float(scores[worst].score):
            continue
        if texts[best].strip() == texts[worst].strip():
            continue
        if require_correct and not (scores[best].acc >= 1.0 and scores[worst].acc < 1.0):
            continue
        pairs.append(
            PreferencePair(
                [dict(m) for m in ex.prompt],
                texts[best],
                texts[worst],
                {
                    "chosen_score": float(scores[best].score),
                    "rejected_score": float(scores[worst].score),
                    "chosen_acc": float(scores[best].acc),
                    "rejected_acc": float(scores[worst].acc),
                    "ground_truth": ex.ground_truth,
                    "data_source": ex.data_source,
                },
            )
        )
    return pairs


def generate_pairs(
    wrapper: Any,
    rollout: Any,
    task: Any,
    examples: Sequence[Example],
    *,
    samples: int,
    max_prompt_length: int,
    batch_size: int,
    generator: torch.Generator,
    require_correct: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> tuple[list[PreferencePair], dict[str, float]]:
    """Preference pairs from ``wrapper``'s own rollouts on ``examples`` (``samples`` per prompt,
    sampled with ``rollout``), scored by ``task``. Returns ``(pairs, stats)``; ``stats`` has the
    mean reward and accuracy of all rollouts and the fraction of prompts that gave a pair."""
    from dare_core.api import chunks, decode_responses, encode_prompts, left_pad

    if samples < 2:
        raise DareError("generating preference pairs needs at least 2 samples per prompt")
    was_training = wrapper.module.training
    wrapper.module.eval()
    pairs: list[PreferencePair] = []
    rewards: list[float] = []
    accs: list[float] = []
    per_call = max(1, batch_size // samples)
    device = wrapper.device
    try:
        for sl in chunks(len(examples), per_call):
            part = list(examples[sl])
            prompts = encode_prompts(wrapper, part, max_prompt_length)
            ids, mask = left_pad(prompts, wrapper.pad_token_id)
            ids = ids.repeat_interleave(samples, 0).to(device)
            mask = mask.repeat_interleave(samples, 0).to(device)
            with torch.no_grad():
                out = rollout.generate(wrapper, ids, mask, generator=generator)
            texts = decode_responses(wrapper, out.response_ids.cpu(), out.response_mask.cpu())
            scores = [task.score(ex, t) for ex, t in zip([e for e in part for _ in range(samples)], texts)]
            rewards.extend(float(s.score) for s in scores)
            accs.extend(float(s.acc) for s in scores)
            pairs.extend(pairs_from_scores(part, texts, scores, samples, require_correct))
            if progress is not None:
                progress(sl.stop, len(examples))
    finally:
        wrapper.module.train(was_training)
    stats = {
        "rollout_reward": sum(rewards) / max(1, len(rewards)),
        "rollout_accuracy": sum(accs) / max(1, len(accs)),
        "pair_yield": len(pairs) / max(1, len(examples)),
        "pairs": float(len(pairs)),
    }
    return pairs, stats
