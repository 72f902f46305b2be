"""Prompt-clustered statistics of two evaluations with several samples per prompt.

When every prompt is answered ``k`` times (sampled decoding), the ``k`` samples of one prompt are
correlated and McNemar's test, which treats samples as independent, overstates the evidence.
:func:`clustered` treats the prompt as the unit: with ``d_p`` the difference of prompt ``p``'s
solve rates over its ``k`` samples, ``D = mean_p d_p``, ``se = sd(d_p) / sqrt(P)`` (unbiased sd)
and a two-sided normal p-value of ``D / se`` (``P`` in the hundreds). Unlike the sign test over
prompts it uses how much each prompt changed, not only the direction.
"""

from __future__ import annotations

import math
from typing import Sequence


def per_prompt(items: Sequence[float], k: int) -> list[float]:
    """Each prompt's total over its ``k`` consecutive samples."""
    if k < 1 or len(items) % k:
        raise ValueError(f"{len(items)} items are not a whole number of prompts of {k} samples")
    return [sum(items[i : i + k]) for i in range(0, len(items), k)]


def clustered(before: Sequence[float], after: Sequence[float], k: int) -> dict[str, float]:
    """Prompt-clustered paired difference; items are ``k`` consecutive samples per prompt."""
    if len(before) != len(after):
        raise ValueError(f"paired evaluations need the same items, got {len(before)} and {len(after)}")
    d = [(y - x) / k for x, y in zip(per_prompt(before, k), per_prompt(after, k))]
    n = len(d)
    mean = sum(d) / n if n else 0.0
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n) if n else 0.0
    if se > 0:
        p = math.erfc(abs(mean) / se / math.sqrt(2.0))
    else:
        p = 1.0 if mean == 0 else 0.0
    return {"prompts": n, "delta": mean, "se": se, "p_value": p}


def describe_clustered(record: dict[str, float]) -> str:
    """One line, e.g. ``+1.82 ± 0.92 points, p = 0.047``."""
    return f"{100 * record['delta']:+.2f} ± {100 * record['se']:.2f} points, p = {record['p_value']:.3g}"
