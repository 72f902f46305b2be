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


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value for ``gained`` vs ``lost`` discordant items."""
    if gained < 0 or lost < 0:
        raise ValueError(f"discordant counts must be >= 0, got {gained} and {lost}")
    m = gained + lost
    if m == 0:
        return 1.0
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
    return {"gained": gained, "lost": lost, "delta": d, "se": se,
            "p_value": mcnemar_exact_p(gained, lost)}


def per_prompt(items: Sequence[float], k: int) -> list[float]:
    """Each prompt's total over its ``k`` consecutive samples."""
    if k < 1 or len(items) % k:
        raise ValueError(f"{len(items)} items are not a whole number of prompts of {k} samples")
    return [sum(items[i:i + k]) for i in range(0, len(items), k)]


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


def describe(record: dict[str, float]) -> str:
    """One line, e.g. ``vs before: +15 / -4 items, delta +5.5 ± 2.2 points, McNemar p = 0.019``."""
    return (f"vs before: +{record['gained']} / -{record['lost']} items, delta "
            f"{100 * record['delta']:+.1f} ± {100 * record['se']:.1f} points, "
            f"McNemar p = {record['p_value']:.3g}")
