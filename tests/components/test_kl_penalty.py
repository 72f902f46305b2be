"""The KL estimators of :func:`~dare_core.components.losses.kl_penalty` against their closed forms
(Schulman's k1, k2, k3 with ``d = ℓ − ℓ_ref`` on tokens drawn from the policy; k3 is GRPO's,
arXiv:2402.03300, and d1's, arXiv:2504.12216), finite for large gaps, and the DARE reference's
``log1p`` rule with its domain guarded."""

import math

import pytest
import torch

from dare_core.components.losses import KL_KINDS, kl_penalty
from dare_core.errors import DareError

GAPS = [-50.0, -20.0, -5.0, -1.0, -0.3, 0.0, 0.4, 1.0, 5.0, 50.0]


def _k3(d: float) -> float:
    """e^{-d} + d - 1 for d ≥ -20; below, its tangent at -20 (keeps the squared gradient norm finite)."""
    if d >= -20.0:
        return math.exp(-d) + d - 1
    return math.exp(20.0) - 21.0 + (1 - math.exp(20.0)) * (d + 20.0)


CLOSED = {
    "k1": lambda d: d,
    "k2": lambda d: d * d / 2,
    "k3": _k3,
    "abs": abs,
    "low_var_kl": lambda d: min(math.exp(-d) + d - 1, 10.0),
}


def _pair(gaps, dtype=torch.float64):
    ref = torch.full((len(gaps),), -3.0, dtype=dtype)
    return ref + torch.tensor(gaps, dtype=dtype), ref


@pytest.mark.parametrize("kind", sorted(CLOSED))
def test_estimators_match_closed_forms(kind):
    logp, ref = _pair(GAPS)
    for adv in (1.0, -1.0):  # the KL estimators ignore the advantage
        got = kl_penalty(logp, ref, torch.full_like(logp, adv), kind)
        want = torch.tensor([CLOSED[kind](d) for d in GAPS], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_k3_is_a_nonnegative_kl_and_default():
    d = torch.linspace(-19.0, 30.0, 400, dtype=torch.float64)
    k3 = kl_penalty(d, torch.zeros_like(d), torch.ones_like(d))
    zero = torch.zeros(3)
    assert bool((k3 >= 0).all()) and kl_penalty(zero, zero, zero).tolist() == [0.0, 0.0, 0.0]
    # unbiased for KL(π‖π_ref): E_{x~π}[k3] = KL, with π = N(0,1), π_ref = N(1,1) → KL = 1/2
    x = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logp, ref = -x.square() / 2, -(x - 1).square() / 2
    assert kl_penalty(logp, ref, torch.ones_like(x), "k3").mean().item() == pytest.approx(0.5, abs=5e-3)
    assert kl_penalty(logp, ref, torch.ones_like(x), "k1").mean().item() == pytest.approx(0.5, abs=5e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl", "abs", "dare_log1p_k3"])
def test_finite_values_and_gradients_for_large_gaps(kind, dtype):
    gaps = [-1e4, -200.0, -50.0, -5.0, 5.0, 50.0, 200.0]
    logp, ref = _pair(gaps, dtype)
    logp.requires_grad_(True)
    adv = torch.full_like(logp, -1.0)  # the dare_log1p rule is defined for every d where A ≤ 0
    out = kl_penalty(logp, ref, adv, kind)
    out.sum().backward()
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(logp.grad).all())


def test_k3_gradient_pulls_towards_the_reference():
    d = torch.tensor([-50.0, -25.0, -20.0, -5.0, -0.5, 0.5, 5.0, 50.0], dtype=torch.float64, requires_grad=True)
    kl_penalty(d, torch.zeros_like(d), torch.ones_like(d), "k3").sum().backward()
    # exact 1 − e^{−d} where the closed form is kept (d ≥ −20), the tangent's slope below
    want = [1 - math.exp(20.0)] * 2 + [1 - math.exp(-v) for v in d.tolist()[2:]]
    torch.testing.assert_close(d.grad, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert bool((d.grad[:5] < 0).all()) and bool((d.grad[5:] > 0).all())


def test_reference_log1p_rule_oracles():
    # algorithms.md §18: kl_penalty(l=[-1,-1], l_ref=[-1.5,-0.5], A=[1,-1]) of the DARE reference
    l, ref, adv = torch.tensor([-1.0, -1.0]), torch.tensor([-1.5, -0.5]), torch.tensor([1.0, -1.0])
    oracles = {
        "dare_log1p_k1": [0.405465, -0.5],
        "dare_log1p_abs": [0.405465, 0.5],
        "dare_log1p_k2": [0.082201, 0.125],
        "dare_log1p_k3": [0.072132, 0.148721],
    }
    for kind, want in oracles.items():
        torch.testing.assert_close(kl_penalty(l, ref, adv, kind), torch.tensor(want), atol=1e-6, rtol=0)
    # the plain estimators differ from the rule where A > 0 (k1 = d = 0.5, not log 1.5)
    torch.testing.assert_close(kl_penalty(l, ref, adv, "k1"), torch.tensor([0.5, -0.5]))


def test_reference_rule_outside_its_domain_is_a_one_line_error():
    logp, ref = torch.tensor([[-3.0, -1.0]]), torch.tensor([[-1.5, -1.0]])  # d = -1.5 where A > 0
    with pytest.raises(DareError, match="kl_type=dare_log1p_k1.*use kl_type=k3") as err:
        kl_penalty(logp, ref, torch.tensor([[1.0]]), "dare_log1p_k1")
    assert "\n" not in str(err.value)
    # A ≤ 0 rows keep k = d, so the same gap is inside the domain there
    assert kl_penalty(logp, ref, torch.tensor([[-1.0]]), "dare_log1p_k1").tolist() == [[-1.5, 0.0]]
    with pytest.raises(DareError, match="unknown kl penalty 'mse'"):
        kl_penalty(logp, ref, torch.tensor([[1.0]]), "mse")


def test_config_choices_are_the_estimators():
    from dare_objectives.policy_options import KL_TYPES, ClipOptions

    assert KL_TYPES == KL_KINDS and ClipOptions().kl_type == "k3"
