import math

import pytest

from dare_plugin_report.stats import clustered, describe_clustered, per_prompt


def test_clustered_by_hand():
    # three prompts x 2 samples; per-prompt differences +1/2, 0, +1
    before = [0, 1, 1, 0, 0, 0]
    after = [1, 1, 1, 0, 1, 1]
    rec = clustered(before, after, 2)
    assert rec["prompts"] == 3
    assert rec["delta"] == pytest.approx(0.5)
    # unbiased sd of (0.5, 0, 1) = 0.5; se = 0.5 / sqrt(3)
    se = 0.5 / math.sqrt(3)
    assert rec["se"] == pytest.approx(se)
    assert rec["p_value"] == pytest.approx(math.erfc(0.5 / se / math.sqrt(2)))
    # identical evaluations: no difference, p = 1; a constant shift: p = 0
    assert clustered(before, before, 2)["p_value"] == 1.0
    assert clustered([0, 0, 0, 0], [1, 1, 1, 1], 2)["p_value"] == 0.0
    with pytest.raises(ValueError, match="whole number of prompts"):
        clustered([0, 1, 1], [1, 1, 1], 2)
    assert per_prompt(after, 2) == [2, 1, 2]
    assert describe_clustered(rec) == f"+50.00 ± {100 * se:.2f} points, p = {rec['p_value']:.3g}"
