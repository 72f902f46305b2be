"""MDPO (arXiv:2508.13148): step-score / advantage / step-selection oracles, loss oracle and
its branches, the intermediate-state rows built from a real recorded rollout, contract, states
built once per rollout batch."""

import json
import math

import pytest
import torch

import dare_plugin_mdpo
from dare_core.api import sum_totals
from dare_core.components import GroupNormAdvantage
from dare_core.config.structure import structure
from dare_core.errors import CapabilityError, DareError
from dare_core.interfaces.rows import TrajectoryContext
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.registries import build_for
from dare_core.testing.rl_probe import assert_one_draw_per_batch, spy_run
from dare_nn.testing import toy_block
from dare_plugin_mdpo.algorithm import (
    MDPOConfig,
    MDPOLoss,
    StepStateRows,
    select_steps,
    step_advantages,
    step_scores,
)
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler


class TestMDPOContract(AlgorithmContract):
    algorithm = "mdpo"
    plugins = (dare_plugin_mdpo,)


R4 = torch.tensor([[0.0, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])


def test_step_score_oracles():
    expect = torch.tensor([[5 / 3, 2.0, 3.0, 2.0], [5 / 3, 2.5, 1.0, 0.0], [3.0, 2, 2, 2], [1.0, 1, 1, 1]])
    torch.testing.assert_close(step_scores(R4), expect)


def test_step_advantages_grouped_by_uid_and_top_steps():
    s = 0.70710678
    adv = step_advantages(step_scores(R4), torch.tensor([0, 0, 1, 1]), GroupNormAdvantage())
    expect = torch.tensor([[0, -s, s, s], [0, s, -s, -s], [s] * 4, [-s] * 4])
    torch.testing.assert_close(adv, expect, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        adv.abs().sum(0), torch.tensor([1.414214, 2.828427, 2.828427, 2.828427]), atol=1e-5, rtol=0
    )
    assert select_steps(adv, 2).tolist() == [2, 3]
    # grouping by id, not by position: the same rows in another order give the same advantages
    perm = torch.tensor([2, 0, 3, 1])
    again = step_advantages(step_scores(R4[perm]), torch.tensor([1, 0, 1, 0]), GroupNormAdvantage())
    torch.testing.assert_close(again, adv[perm], atol=1e-6, rtol=0)


def test_loss_oracle():
    loss_fn = MDPOLoss(epsilon=0.2)
    lp = torch.tensor([[-1.0, -0.5, -2.0]])
    old = torch.tensor([[-1.1, -0.5, -1.0]])
    mask = torch.tensor([[1.0, 1, 0]])
    conf = torch.tensor([[0.9, 0.5, 0.3]])
    loss, m = loss_fn(lp[None], old[None], None, torch.tensor([0.8]), mask, extras={"confidence": conf})
    assert loss.item() == pytest.approx(-0.8967923, abs=1e-6)


def test_loss_branches_no_dual_clip_and_lambda_per_row():
    loss_fn = MDPOLoss(epsilon=0.2)
    conf = torch.ones(1, 4)
    mask = torch.tensor([[1.0, 0, 0, 0]])  # λ = 4
    old = torch.zeros(1, 4)
    big = torch.tensor([[2.0, 0, 0, 0]])
    # A < 0 and a large ratio: max(-A r λ, -A·1.2·λ) = -A r λ, unbounded (no dual clip)
    loss, m = loss_fn(big, old, None, torch.tensor([-1.0]), mask, extras={"confidence": conf})
    assert loss.item() == pytest.approx(math.exp(2.0) * 4, rel=1e-6)
    assert m["pg_clipfrac"] == 0.0
    # A > 0 and a large ratio: clipped at 1 + ε
    loss, m = loss_fn(big, old, None, torch.tensor([1.0]), mask, extras={"confidence": conf})
    assert loss.item() == pytest.approx(-1.2 * 4, rel=1e-6) and m["pg_clipfrac"] == 1.0
    # β (ℓ_ref − ℓ)²/2 when the KL term is on
    kl = MDPOLoss(epsilon=0.2, kl_coef=0.5)
    loss, m = kl(old, old, old + 1.0, torch.tensor([0.0]), mask, extras={"confidence": conf})
    assert loss.item() == pytest.approx(0.5 * 0.5, rel=1e-6) and m["kl_loss"] == pytest.approx(0.5)  # not scaled by λ
    with pytest.raises(ValueError):
        loss_fn(old, old, None, torch.tensor([1.0]), mask)


@pytest.mark.parametrize("kl_coef", [0.0, 0.4])
def test_loss_is_the_mini_batch_loss_for_every_split(kl_coef):
    """The masked positions are counted over the mini-batch: calls on parts with the summed
    totals add up to the whole batch's loss and gradient (fp64), KL term included."""
    g = torch.Generator().manual_seed(0)
    B, R = 7, 5
    logp = -torch.rand(B, R, generator=g, dtype=torch.float64) * 2
    old = logp + 0.3 * torch.randn(B, R, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(B, R, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, R, generator=g) < 0.6).double()
    mask[1] = 0.0
    conf = torch.rand(B, R, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    loss_fn = MDPOLoss(epsilon=0.2, kl_coef=kl_coef)

    def run(parts):
        x = logp.clone().requires_grad_(True)
        T = sum_totals([loss_fn.totals(mask[i], {"confidence": conf[i]}) for i in parts])
        total = sum(
            loss_fn(x[i], old[i], ref[i], adv[i], mask[i], extras={"confidence": conf[i]}, totals=T)[0] for i in parts
        )
        total.backward()
        return total.detach(), x.grad

    whole, grad = run([torch.arange(B)])
    alone = loss_fn(logp, old, ref, adv, mask, extras={"confidence": conf})[0]
    torch.testing.assert_close(whole, alone, rtol=0, atol=1e-12)
    for size in (1, 2, 3):
        got, g_got = run(list(torch.randperm(B, generator=g).split(size)))
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)
        torch.testing.assert_close(g_got, grad, rtol=0, atol=1e-12)


def _rows(count_after_eos=False, truncate=False):
    w = make_toy_wrapper()
    sampler = LowConfidenceSampler(
        LowConfidenceConfig(gen_length=8, block_length=4, steps=4, temperature=1.0, truncate_at_eos=truncate)
    )
    prompts = torch.randint(4, 60, (4, 5), generator=torch.Generator().manual_seed(0))
    pmask = torch.ones_like(prompts)
    roll = sampler.generate(
        w, prompts, pmask, record=frozenset({"step_states"}), generator=torch.Generator().manual_seed(2)
    )
    seen = []

    def score(ids, mask, rows):
        seen.append(ids.clone())
        return (ids % 2 == 0).float().mean(-1)

    ctx = TrajectoryContext(torch.zeros(4), torch.zeros(4), torch.tensor([0, 0, 1, 1]), score)
    builder = StepStateRows(GroupNormAdvantage(), sample_train_steps=2, count_after_eos=count_after_eos)
    return w, roll, builder.rows(w, roll, ctx), seen


def test_rows_from_recorded_states():
    w, roll, rows, seen = _rows()
    ex = roll.extras
    K = ex["step_inputs"].shape[1]
    assert K == 4 and len(seen) == K
    for k in range(K):  # every step's prediction was rewarded
        assert torch.equal(seen[k], ex["step_predictions"][:, k])
    rewards = torch.stack([(ex["step_predictions"][:, k] % 2 == 0).float().mean(-1) for k in range(K)], 1)
    adv = step_advantages(step_scores(rewards), torch.tensor([0, 0, 1, 1]), GroupNormAdvantage())
    steps = select_steps(adv, 2)
    P = rows.batch.prompt_len
    assert rows.num_rows == 8
    for i, k in enumerate(steps.tolist()):  # step-major rows
        sl = slice(4 * i, 4 * i + 4)
        assert torch.equal(rows.batch.input_ids[sl, P:], ex["step_predictions"][:, k])
        assert torch.equal(rows.corrupted.noisy_ids[0, sl, P:], ex["step_inputs"][:, k])
        torch.testing.assert_close(rows.advantages[sl], adv[:, k])
        torch.testing.assert_close(rows.extras["confidence"][sl], ex["step_confidence"][:, k].float())
        assert torch.equal(rows.weights[sl].bool(), ex["step_inputs"][:, k] == w.mask_token_id)
    # predictions keep committed tokens; the first state is all mask
    assert (ex["step_inputs"][:, 0] == w.mask_token_id).all()
    committed = ex["step_inputs"] != w.mask_token_id
    assert torch.equal(ex["step_predictions"][committed], ex["step_inputs"][committed])


def test_positions_after_eos_follow_the_option():
    for count in (False, True):
        w, roll, rows, _ = _rows(count_after_eos=count, truncate=True)
        P = rows.batch.prompt_len
        outside = rows.batch.attention_mask[:, P:] == 0
        if count:
            assert torch.equal(rows.weights.bool(), rows.corrupted.noisy_ids[0, :, P:] == w.mask_token_id)
        else:
            assert not rows.weights[outside].any()


def test_missing_record_and_block_models_refused():
    w = make_toy_wrapper()
    roll = LowConfidenceSampler(LowConfidenceConfig(gen_length=4, block_length=4, steps=2)).generate(
        w, torch.randint(4, 60, (2, 3)), torch.ones(2, 3, dtype=torch.long)
    )
    ctx = TrajectoryContext(torch.zeros(2), torch.zeros(2), torch.arange(2), lambda *a: torch.zeros(2))
    with pytest.raises(DareError, match="step_states"):
        StepStateRows(GroupNormAdvantage()).rows(w, roll, ctx)
    from dare_core.config.loader import check_support

    dare = build_for(toy_block, dare_plugin_mdpo)
    with pytest.raises(CapabilityError):
        check_support(dare, "mdpo", "block_toy")


def test_config_invariants_are_validators():
    _, problems = structure(MDPOConfig, {"epsilon": 1.5, "sample_train_steps": 0}, "algorithm")
    assert len(problems) == 2


def test_states_built_once_per_rollout_batch_and_shared_by_old_ref_new(tmp_path):
    log = spy_run(
        tmp_path,
        dare_plugin_mdpo,
        "mdpo",
        toy,
        [
            "rollout.gen_length=4",
            "rollout.block_length=4",
            "rollout.steps=4",
            "algorithm.kl_coef=0.1",
            "algorithm.sample_train_steps=2",
        ],
    )
    assert_one_draw_per_batch(log, steps=2)
    lines = [json.loads(l) for l in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    first = [l for l in lines if "reward" in l][0]
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # same states for old and new
    assert "step_reward_mean" in first
