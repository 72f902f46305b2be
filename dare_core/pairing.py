"""Paired comparison of two evaluations on the same held-out items.

Before and after training the same prompts are decoded (greedily, with the same sampler), so the
difference in accuracy is best judged item by item: only the *discordant* items — solved after
but not before (``gained``) or the reverse (``lost``) — carry information about the change.
McNemar's exact test asks how likely a split at least as lopsided as ``gained`` : ``lost`` is
when each discordant item is equally likely to fall either way:

    p = min(1, 2 * P[X <= min(gained, lost)]),  X ~ Binomial(gained + lost, 1/2).

The standard error of the paired accuracy difference ``d = (gained - lost) / n`` is
``sqrt(gained + lost - n d^2) / n``, smaller than that of two independent proportions whenever
the two evaluations agree on most items.
"""

from __future__ import annotations

import math
from typing import Sequence


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value for ``gained`` vs ``lost`` discordant items."""
    if gained < 0 or lost < 0:
        raise ValueError(f"discordant counts must be >= 0, got {gained} and {lost}")
    m = gained + lost
    k = min(gained, lost)
    # Integer numerator and denominator: ``2.0 ** m`` overflows a float beyond m = 1023 (a few
    # thousand sampled answers); int / int is correctly rounded at any size.
    tail = sum(math.comb(m, i) for i in range(k + 1)) / (1 << m)
    return min(1.0, 2.0 * tail)


def paired_counts(before: Sequence[float], after: Sequence[float]) -> tuple[int, int]:
    """``(gained, lost)``: items correct only after, items correct only before (correct = > 0.5)."""
    if len(before) != len(after):
        raise ValueError(f"paired evaluations need the same items, got {len(before)} and {len(after)}")
    gained = sum(1 for b, a in zip(before, after) if a > 0.5 >= b)
    lost = sum(1 for b, a in zip(before, after) if b > 0.5 >= a)
    return gained, lost


def compare(gained: int, lost: int, n: int) -> dict[str, float]:
    """The summary record of a paired comparison over ``n`` items."""
    d = (gained - lost) / n if n else 0.0
    se = math.sqrt(max(0.0, gained + lost - n * d * d)) / n if n else 0.0
    return {"gained": gained, "lost": lost, "delta": d, "se": se, "p_value": mcnemar_exact_p(gained, lost)}


def describe(record: dict[str, float]) -> str:
    """One line, e.g. ``vs before: +15 / -4 items, delta +5.5 ± 2.2 points, McNemar p = 0.019``."""
    return (
        f"vs before: +{record['gained']} / -{record['lost']} items, delta "
        f"{100 * record['delta']:+.1f} ± {100 * record['se']:.1f} points, "
        f"McNemar p = {record['p_value']:.3g}"
    )
