"""Oracles of the generic losses and advantage estimators (GRPO, arXiv:2402.03300; RLOO,
arXiv:2402.14740; the clipped PPO objective with dual clip and its KL penalties)."""

import pytest
import torch

from dare_core.components import ClippedPolicyLoss, GroupNormAdvantage, RLOOAdvantage, agg_loss, masked_mean
from dare_core.components.losses import mask_totals, sum_totals
from dare_core.errors import DareError
from dare_objectives.policy_options import PenalizedClippedLoss

A = torch.tensor([0.5, -1.0])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])


def test_group_norm_oracle():
    adv = GroupNormAdvantage()(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([7, 7, 7, 7]))
    torch.testing.assert_close(adv, torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=2e-6, rtol=0)


def test_group_norm_all_equal_singleton_and_order_free():
    gn = GroupNormAdvantage()
    assert torch.equal(gn(torch.tensor([2.0, 2.0, 2.0]), torch.tensor([0, 0, 0])), torch.zeros(3))
    torch.testing.assert_close(gn(torch.tensor([3.0]), torch.tensor([5])), torch.tensor([3.0 / (1 + 1e-6)]))
    shuffled = gn(torch.tensor([1.0, 5.0, 0.0, 3.0]), torch.tensor([0, 1, 0, 1]))
    torch.testing.assert_close(shuffled[[0, 2]], gn(torch.tensor([1.0, 0.0]), torch.tensor([0, 0])))
    no_std = GroupNormAdvantage(norm_by_std=False)(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    torch.testing.assert_close(no_std, torch.tensor([0.5, -0.5]))


def test_rloo_oracle():
    adv = RLOOAdvantage()(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]))
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_rloo_group_of_one_in_a_mixed_batch_keeps_its_reward():
    # reference (verl core_algos.compute_rloo_outcome_advantage): a group of one has baseline 0
    adv = RLOOAdvantage()(torch.tensor([1.0, 0.5, 0.0, 1.0, 0.25]), torch.tensor([3, 9, 3, 3, 4]))
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.5, -1.0, 0.5, 0.25]))


def test_agg_loss_oracles():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # masked sum 3 + 15 = 18, 5 tokens
    assert agg_loss(loss, MASK, "token-mean").item() == pytest.approx(18 / 5)  # Σ mℓ / tokens
    assert agg_loss(loss, MASK, "seq-mean-token-sum").item() == pytest.approx(18 / 2)  # Σ mℓ / rows
    # Σ_b (Σ_t mℓ / Σ_t m) / rows
    assert agg_loss(loss, MASK, "seq-mean-token-mean").item() == pytest.approx((3 / 2 + 15 / 3) / 2)
    # Σ mℓ / cells, cells = B·R = 6 (Dr. GRPO: 1/G Σ_i Σ_t ℓ / MAX_LEN)
    assert agg_loss(loss, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(18 / 6)
    with pytest.raises(ValueError):
        agg_loss(loss, MASK, "bogus")
    assert masked_mean(torch.ones(2), torch.zeros(2)).item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_agg_loss_shares_over_global_totals_add_up_to_the_whole(mode):
    """Each row's share, normalised by the totals of all rows, sums to the loss of all rows."""
    loss = torch.arange(12.0).reshape(3, 4)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.5]])
    totals = sum_totals([mask_totals(mask[i : i + 1]) for i in range(3)])
    assert {k: float(v) for k, v in totals.items()} == {"tokens": 6.5, "rows": 3.0, "cells": 12.0}
    shares = sum(agg_loss(loss[i : i + 1], mask[i : i + 1], mode, totals) for i in range(3))
    assert float(shares) == pytest.approx(float(agg_loss(loss, mask, mode)))


def test_seq_mean_token_mean_refuses_a_row_without_tokens():
    # reference (verl agg_loss): Σ_t m ℓ / Σ_t m is 0/0 = NaN for such a row; refused instead
    loss, mask = torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(DareError, match="seq-mean-token-mean"):
        agg_loss(loss, mask, "seq-mean-token-mean")
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(1.0)


def test_ppo_kl_is_to_the_reference_when_given():
    # reference (dllm_core_algos.compute_policy_loss): k3 of ℓ_ref − ℓ when ref log-probs are given
    new = OLD + torch.tensor([[0.3, -0.3, 0.0], [0.3, -0.3, 2.0]])
    ref = OLD - torch.tensor([[0.5, 1.0, 0.0], [2.0, 0.0, -1.0]])
    d = ref - new
    expected = masked_mean(torch.exp(d) - d - 1.0, MASK).item()
    for r in (ref, ref[None]):
        _, m = ClippedPolicyLoss()(new[None], OLD[None], r, A, MASK)
        assert m["ppo_kl"] == pytest.approx(expected, rel=1e-6)
    _, m = ClippedPolicyLoss()(new, OLD, ref, A, MASK)
    assert m["ppo_kl"] == pytest.approx(expected, rel=1e-6)
    _, m = PenalizedClippedLoss(ClippedPolicyLoss(), kl_coef=0.1)(new[None], OLD[None], ref[None], A, MASK)
    assert m["ppo_kl"] == pytest.approx(expected, rel=1e-6)


def test_clipped_loss_ratio_one_is_minus_mean_advantage():
    loss, m = ClippedPolicyLoss()(OLD[None], OLD[None], None, A, MASK)
    assert loss.item() == pytest.approx(0.4, abs=1e-7)
    assert m["pg_clipfrac"] == 0.0 and m["ppo_kl"] == pytest.approx(0.0, abs=1e-9)


def test_clipped_loss_oracle_with_dual_clip():
    new = OLD + torch.tensor([[0.3, -0.3, 0.0], [0.3, -0.3, 2.0]])
    loss, m = ClippedPolicyLoss(0.2, 0.2, 3.0)(new[None], OLD[None], None, A, MASK)
    assert loss.item() == pytest.approx(0.8358899, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.4)
    assert m["ppo_kl"] == pytest.approx(0.2633379, abs=1e-6)
    assert m["pg_clipfrac_lower"] == pytest.approx(0.2)


def test_clipped_loss_gradient_at_ratio_one():
    new = OLD.clone().requires_grad_(True)
    loss, _ = ClippedPolicyLoss()(new[None], OLD[None], None, A, MASK)
    loss.backward()
    expected = -(A[:, None] * MASK) / MASK.sum()
    torch.testing.assert_close(new.grad, expected)


def test_clipped_loss_averages_over_mc_samples():
    new = torch.stack([OLD, OLD + 0.1])
    loss, _ = ClippedPolicyLoss()(new, torch.stack([OLD, OLD]), None, A, MASK)
    one, _ = ClippedPolicyLoss()(new[:1], OLD[None], None, A, MASK)
    two, _ = ClippedPolicyLoss()(new[1:], OLD[None], None, A, MASK)
    assert loss.item() == pytest.approx((one.item() + two.item()) / 2)
    with pytest.raises(ValueError):
        ClippedPolicyLoss(clip_ratio_c=1.0)
