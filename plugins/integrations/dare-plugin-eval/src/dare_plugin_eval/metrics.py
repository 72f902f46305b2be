"""The metrics of ``dare eval``: pass@k (unbiased estimator), maj@k (majority vote) and a task's
summary over its per-sample records. Pure Python; no torch."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

__all__ = ["maj_at_k", "pass_at_k", "summarise"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of ``k`` samples drawn without replacement from ``n``
    samples, ``c`` of them correct, is correct: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021,
    arXiv:2107.03374, Eq. 1), computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (no large
    binomials). 1.0 when fewer than ``k`` samples are wrong (``n - c < k``). Raises ValueError
    unless ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def maj_at_k(preds: Sequence[str], accs: Sequence[float], k: int) -> float:
    """Whether the majority answer of the first ``k`` samples is correct (1.0 or 0.0).

    The samples vote with their extracted answers (``preds``; an empty answer does not vote); the
    most frequent answer wins, a tie going to the answer that occurs first among the ``k``
    samples. The result is the accuracy (``accs``) of the first sample giving the winning answer;
    0.0 when no sample has an answer. Raises ValueError unless ``1 <= k <= len(preds)``."""
    if not 1 <= k <= len(preds) or len(preds) != len(accs):
        raise ValueError(f"maj@k needs 1 <= k <= {len(preds)} samples (and one accuracy per sample), got k={k}")
    votes = Counter(p for p in preds[:k] if p)
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(p for p in preds[:k] if p and votes[p] == top)  # the first to reach the top count
    return float(accs[preds.index(winner)])


def summarise(records: Sequence[dict[str, Any]], samples: int, ks: Sequence[int]) -> dict[str, Any]:
    """A task's metrics from its records (item-major: ``samples`` consecutive records per item,
    each with ``score``, ``acc``, ``pred``, ``kind``): ``n`` items; ``accuracy`` and ``reward``,
    the means over the items of the first sample's ``acc`` and ``score``; ``pass@k`` for each k of
    ``ks`` (a sample is correct when its ``acc`` is 1); ``maj@k`` for each k > 1 of ``ks`` when
    any sample has an extracted answer (``maj@1`` is ``accuracy``); ``kinds``, the count of each
    failure kind over all samples, when any sample has one."""
    items = [records[i : i + samples] for i in range(0, len(records), samples)]
    n = len(items)
    out: dict[str, Any] = {
        "n": n,
        "samples": samples,
        "accuracy": sum(it[0]["acc"] for it in items) / max(1, n),
        "reward": sum(it[0]["score"] for it in items) / max(1, n),
    }
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(samples, sum(r["acc"] >= 1.0 for r in it), k) for it in items) / max(1, n)
    if any(r["pred"] for r in records):
        for k in (k for k in ks if k > 1):
            out[f"maj@{k}"] = sum(maj_at_k([r["pred"] for r in it], [r["acc"] for r in it], k) for it in items) / max(
                1, n
            )
    if any(r["kind"] for r in records):
        out["kinds"] = dict(sorted(Counter(r["kind"] for r in records if r["kind"]).items()))
    return out
