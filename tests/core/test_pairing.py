import math

import pytest

from dare_core.pairing import compare, describe, mcnemar_exact_p, paired_counts


def test_exact_mcnemar_by_hand():
    # 1 gained, 0 lost: P[X <= 0] = 1/2, doubled = 1
    assert mcnemar_exact_p(1, 0) == 1.0
    # 5 vs 0: 2 * (1/2)^5
    assert mcnemar_exact_p(5, 0) == pytest.approx(2 / 32)
    # 8 vs 2: 2 * (C(10,0) + C(10,1) + C(10,2)) / 2^10 = 2 * 56 / 1024
    assert mcnemar_exact_p(8, 2) == pytest.approx(112 / 1024)
    assert mcnemar_exact_p(2, 8) == mcnemar_exact_p(8, 2)
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(7, 7) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact_p(-1, 2)


def test_exact_mcnemar_with_thousands_of_discordant_items():
    # 16,000 sampled answers give thousands of discordant pairs: 2.0 ** m would overflow.
    assert mcnemar_exact_p(1500, 1500) == 1.0
    # 1100 vs 900: the continuity-corrected normal approximation, z = 199 / sqrt(2000).
    approx = math.erfc(199 / math.sqrt(2000) / math.sqrt(2.0))
    assert mcnemar_exact_p(1100, 900) == pytest.approx(approx, rel=0.05)


def test_paired_counts_and_record():
    before = [1, 0, 0, 1, 1, 0, 0.0, 1]
    after = [1, 1, 1, 0, 1, 0, 0.0, 1]
    assert paired_counts(before, after) == (2, 1)
    rec = compare(2, 1, 8)
    assert rec["delta"] == pytest.approx(1 / 8)
    # paired SE: sqrt(b + c - n d^2) / n
    assert rec["se"] == pytest.approx(math.sqrt(3 - 8 / 64) / 8)
    assert describe(rec).startswith("vs before: +2 / -1 items, delta +12.5 ± ")
    with pytest.raises(ValueError, match="same items"):
        paired_counts([1, 0], [1])
