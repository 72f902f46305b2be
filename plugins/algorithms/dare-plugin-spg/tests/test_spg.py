"""SPG (arXiv:2510.09541): loss and bound oracles, the sign rule, the block-wise corruption
including the DARE reference's non-uniform block choice, the estimator, the contract."""

import math

import pytest
import torch

import dare_plugin_spg
from dare_core.api import sum_totals
from dare_core.config.structure import structure
from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.contracts import AlgorithmContract
from dare_plugin_spg.algorithm import BlockWiseMasking, SPGBounds, SPGConfig, SPGLoss, spg_bounds


class TestSPGContract(AlgorithmContract):
    algorithm = "spg"
    plugins = (dare_plugin_spg,)


def _rows(elbo, eubo):
    return torch.stack([torch.tensor(elbo), torch.tensor(eubo)])


def test_loss_oracle_length_weighted_reinforce():
    # ℓ = [-0.5, -1.0]; the negative row uses the mix, so give it equal bounds
    logp = _rows([-0.5, -1.0], [9.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    loss, m = SPGLoss("mix", 0.5)(logp, None, None, torch.tensor([1.0, -0.5]), mask)
    assert loss.item() == pytest.approx(-0.0714286, abs=1e-6)
    assert m["spg_lower_bound_frac"] == 0.5


def test_loss_is_the_mini_batch_loss_for_every_split():
    """Lengths are summed over the mini-batch: calls on parts with the summed totals add up to the
    whole batch's loss and gradient (fp64), rows of different lengths, both sign branches."""
    g = torch.Generator().manual_seed(0)
    B, M = 7, 3
    bounds = torch.randn(2 + M, B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, 5, generator=g) < 0.7).double()
    mask[2] = 0.0
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    loss_fn = SPGLoss("mix", 0.3)

    def run(parts):
        x = bounds.clone().requires_grad_(True)
        T = sum_totals([loss_fn.totals(mask[i], None) for i in parts])
        total = sum(loss_fn(x[:, i], None, None, adv[i], mask[i], totals=T)[0] for i in parts)
        total.backward()
        return total.detach(), x.grad

    whole, grad = run([torch.arange(B)])
    torch.testing.assert_close(whole, loss_fn(bounds, None, None, adv, mask)[0], rtol=0, atol=1e-12)
    for size in (1, 2, 3):
        got, g_got = run(list(torch.randperm(B, generator=g).split(size)))
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)
        torch.testing.assert_close(g_got, grad, rtol=0, atol=1e-12)


def test_bound_oracle_two_masked_tokens():
    logp = torch.log(torch.tensor([[[0.5, 0.25, 0.9, 0.9]]]))
    targets = torch.tensor([[[True, True, False, False]]])
    elbo, eubo, rows = spg_bounds(logp, targets, torch.tensor([4]), 1.5)
    assert elbo.item() == pytest.approx(-1.0397208, abs=1e-6)
    assert eubo.item() == pytest.approx(-0.5776227, abs=1e-6)
    mix = SPGLoss("mix", 0.5)
    loss, _ = mix(torch.stack([elbo, eubo]), None, None, torch.tensor([-1.0]), torch.ones(1, 4))
    assert loss.item() == pytest.approx(-0.8086717, abs=1e-6)  # -A·ℓ⁻ with A = -1
    torch.testing.assert_close(rows, elbo[None])


def test_eubo_averages_rows_inside_the_log():
    # two rows, token 0 masked in both (t = 1/2 each), token 1 only in row 1 (t = 1/2)
    p = torch.tensor([[[0.5, 0.9]], [[0.2, 0.4]]])
    targets = torch.tensor([[[True, False]], [[True, True]]])
    _, eubo, _ = spg_bounds(p.log(), targets, torch.tensor([2]), 2.0)
    t = torch.tensor([0.5, 1.0])
    q0 = (0.5**2 / t[0] + 0.2**2 / t[1]) / 2
    q1 = (0.4**2 / t[1]) / 2
    assert eubo.item() == pytest.approx((math.log(q0) + math.log(q1)) / 2 / 2.0, rel=1e-6)


@pytest.mark.parametrize(
    "adv,mask_sum,branch", [(1.0, 4, "elbo"), (0.0, 4, "lower"), (-1.0, 4, "lower"), (1.0, 0, "lower")]
)
def test_sign_rule(adv, mask_sum, branch):
    mask = torch.zeros(1, 4)  # bounds: ELBO -1, EUBO -3, mix -2
    mask[0, :mask_sum] = 1
    loss_fn = SPGLoss("mix", 0.5)
    ell = torch.tensor([-1.0, -3.0], requires_grad=True)
    loss, m = loss_fn(torch.stack([ell[:1], ell[1:]]), None, None, torch.tensor([adv]), mask)
    loss.backward() if loss.requires_grad else None
    if mask_sum and adv != 0:
        expect = -adv * (-1.0 if branch == "elbo" else -2.0)
        assert loss.item() == pytest.approx(expect)
    grad = ell.grad if ell.grad is not None else torch.zeros(2)
    if branch == "elbo":
        assert grad[1].item() == 0.0 and m["spg_lower_bound_frac"] == 1.0
    else:
        assert m["spg_lower_bound_frac"] == 0.0
        if adv != 0 and mask_sum:
            assert grad[1].item() != 0.0


@pytest.mark.parametrize("mode,expect", [("eubo", -3.0), ("elbo", -1.0), ("zero", 0.0)])
def test_negative_branch_modes(mode, expect):
    loss, _ = SPGLoss(mode, 0.5)(_rows([-1.0], [-3.0]), None, None, torch.tensor([-1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(expect)


def _batch(B, P=4, R=8, Lv=6):
    ids = torch.randint(10, 40, (B, P + R), generator=torch.Generator().manual_seed(0))
    att = torch.ones(B, P + R, dtype=torch.long)
    att[:, P + Lv :] = 0
    return SequenceBatch(ids, att, P)


def test_block_masking_oracle():
    w = make_toy_wrapper()
    batch = _batch(400)
    c = BlockWiseMasking(mc_num=1, block_length=4, p_mask_prompt=0.15)(w, batch, torch.Generator().manual_seed(0))
    masked, p = c.masked[0], c.p_mask[0]
    seen = set()
    for b in range(400):
        r_m, r_p = masked[b, 4:], p[b, 4:]
        assert not r_m[6:].any() and (r_p[6:] == 0).all()  # padding untouched here
        if not math.isclose(float(r_p[0]), 0.15, rel_tol=1e-6):
            # block 0 chosen: k of 4 masked with p = k/4, the rest of the valid response fully masked
            k = int(r_m[:4].sum())
            assert 1 <= k <= 4 and torch.allclose(r_p[:4], torch.tensor(k / 4))
            assert r_m[4:6].all() and (r_p[4:6] == 1).all()
            seen.add(("block0", k))
        else:
            # block 1 chosen: k ∈ {1, 2} of its 2 valid tokens with p = k/2; earlier block at rate 0.15
            k = int(r_m[4:6].sum())
            assert k in (1, 2) and torch.allclose(r_p[4:6], torch.tensor(k / 2))
            assert torch.allclose(r_p[:4], torch.tensor(0.15))
            seen.add(("block1", k))
    assert {("block1", 1), ("block1", 2), ("block0", 1), ("block0", 4)} <= seen
    assert torch.allclose(p[:, :4], torch.tensor(0.15))
    rate = masked[:, :4].float().mean().item()
    assert abs(rate - 0.15) < 0.03
    assert (c.noisy_ids[c.masked] == w.mask_token_id).all()


def test_block_choice_quirk_is_not_uniform():
    # R = 12 (3 blocks of 4), L_v = 6 (2 valid blocks): a permutation of {0,1,2} mod 2 picks block 0 w.p. 2/3
    w = make_toy_wrapper()
    batch = _batch(3000, R=12, Lv=6)
    c = BlockWiseMasking(mc_num=1, block_length=4)(w, batch, torch.Generator().manual_seed(1))
    # block 0 chosen iff the first response token is not at the 0.15 "before the block" rate
    block0 = (c.p_mask[0, :, 4] - 0.15).abs() > 1e-6
    frac0 = block0.float().mean().item()
    assert abs(frac0 - 2 / 3) < 0.04, frac0


def test_more_rows_than_blocks_and_estimator_matches_direct_computation():
    w = make_toy_wrapper()
    batch = _batch(3)
    c = BlockWiseMasking(mc_num=5, block_length=4)(w, batch, torch.Generator().manual_seed(0))
    out = SPGBounds(1.5)(w, batch, c)
    assert out.shape == (2 + 5, 3)
    lp = torch.stack(
        [
            torch.log_softmax(w.logits(c.noisy_ids[m], batch.attention_mask).float(), -1).gather(
                -1, batch.input_ids[..., None]
            )[..., 0][:, 4:]
            for m in range(5)
        ]
    )
    targets = c.masked[:, :, 4:] & batch.response_mask.bool()[None]
    elbo, eubo, rows = spg_bounds(lp, targets, batch.response_mask.sum(-1), 1.5)
    torch.testing.assert_close(out, torch.cat([elbo[None], eubo[None], rows]), rtol=1e-5, atol=1e-5)
    assert (targets.sum(-1) >= 1).all()


def test_config_validators():
    _, problems = structure(
        SPGConfig, {"min_t": 0.5, "max_t": 0.2, "eubo_beta": 0.5, "logp_estimation": "upper"}, "algorithm"
    )
    assert len(problems) == 3


def test_masking_block_is_the_rollouts_unless_set():
    """``block_length`` has one owner: the rollout config; SPG's option only overrides it."""
    import attrs as _attrs

    from dare_plugin_spg.algorithm import SPGConfig, masking_block

    @_attrs.frozen
    class Blocks:
        block_length: int = 8

    @_attrs.frozen
    class NoBlocks:
        steps: int = 4

    assert masking_block(SPGConfig(), Blocks()) == 8
    assert masking_block(SPGConfig(), NoBlocks()) == 32
    assert masking_block(SPGConfig(), None) == 32
    assert masking_block(SPGConfig(block_length=40), Blocks()) == 40
