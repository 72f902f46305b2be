"""pass@k against its closed form, maj@k's vote and tie rule, a task's summary."""

from math import comb

import pytest

from dare_plugin_eval.metrics import maj_at_k, pass_at_k, summarise


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_closed_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 3) == 0.0  # nothing correct
    assert pass_at_k(10, 10, 3) == 1.0  # everything correct
    assert pass_at_k(10, 8, 3) == 1.0  # n - c < k: every draw of 3 holds a correct one
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is the fraction correct
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # large n: no overflow
    for bad in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_maj_at_k_votes_over_the_first_k_answers():
    preds, accs = ["7", "3", "3", "7", "7"], [1.0, 0.0, 0.0, 1.0, 1.0]
    assert maj_at_k(preds, accs, 3) == 0.0  # 3 wins 2:1 among the first three
    assert maj_at_k(preds, accs, 5) == 1.0  # 7 wins 3:2
    assert maj_at_k(preds, accs, 1) == 1.0  # the first answer


def test_maj_at_k_breaks_ties_by_first_occurrence_and_skips_empty_answers():
    assert maj_at_k(["3", "7", "7", "3"], [0.0, 1.0, 1.0, 0.0], 4) == 0.0  # 2:2, 3 came first
    assert maj_at_k(["7", "3", "3", "7"], [1.0, 0.0, 0.0, 1.0], 4) == 1.0  # 2:2, 7 came first
    assert maj_at_k(["", "", "5"], [0.0, 0.0, 1.0], 3) == 1.0  # empty answers do not vote
    assert maj_at_k(["", ""], [0.0, 0.0], 2) == 0.0  # no answer at all
    with pytest.raises(ValueError):
        maj_at_k(["1"], [1.0], 2)


def _rec(acc, pred="", kind="", score=None):
    return {"acc": acc, "score": acc if score is None else score, "pred": pred, "kind": kind}


def test_summary_of_two_items_with_three_samples():
    records = [
        _rec(1.0, "a", "passed", 1.0),
        _rec(0.0, "b", "wrong", 0.5),
        _rec(0.0, "b", "wrong"),
        _rec(0.0, "c", "timeout", 0.25),
        _rec(0.0, "", "error"),
        _rec(1.0, "d", "passed"),
    ]
    m = summarise(records, 3, [1, 2, 3])
    assert m["n"] == 2 and m["samples"] == 3
    assert m["accuracy"] == 0.5 and m["reward"] == pytest.approx((1.0 + 0.25) / 2)  # first samples
    assert m["pass@1"] == pytest.approx((1 / 3 + 1 / 3) / 2)
    assert m["pass@3"] == 1.0 and m["pass@2"] == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert m["maj@2"] == 0.5  # item 0: a:b tie -> a (right); item 1: c alone (wrong)
    assert m["maj@3"] == 0.0  # item 0: b wins 2:1; item 1: c:d tie -> c
    assert "maj@1" not in m  # it is the accuracy
    assert m["kinds"] == {"error": 1, "passed": 2, "timeout": 1, "wrong": 2}


def test_summary_without_answers_or_kinds_has_neither():
    m = summarise([_rec(1.0), _rec(0.0)], 1, [1])
    assert m == {"n": 2, "samples": 1, "accuracy": 0.5, "reward": 0.5, "pass@1": 0.5}
