"""EBPO (LLaDA2.1, arXiv:2602.08676): the sequence-level loss oracle, the block-count oracle,
the composite ELBO under uniform logits, the corruption and estimator on the family-free
block-diffusion toy (BD3LM layout), exact proxy-gradient accumulation, the contract."""

import math

import pytest
import torch

import dare_plugin_ebpo
from dare_core.api import sum_totals
from dare_core.config.structure import structure
from dare_core.errors import DareError
from dare_core.interfaces import SequenceBatch
from dare_core.testing import contracts, toy
from dare_core.testing.algorithm_checks import (
    algorithm_components,
    check_accumulate_matches_backward,
    one_rl_step,
    partition_gradient,
)
from dare_core.testing.contracts import AlgorithmContract
from dare_nn.testing import toy_block
from dare_nn.testing.toy_block import make_toy_block_wrapper
from dare_plugin_ebpo.algorithm import (
    BlockELBOMasking,
    EBPOConfig,
    EBPOLoss,
    block_mask_counts,
    ebpo_sequence_loss,
)


class TestEBPOContract(AlgorithmContract):
    """The core contract, run on the block-diffusion toy (EBPO is block-only)."""

    algorithm = "ebpo"
    plugins = (dare_plugin_ebpo,)

    @pytest.fixture(autouse=True)
    def _block_toy(self, monkeypatch):
        monkeypatch.setattr(contracts, "make_toy_wrapper", make_toy_block_wrapper)
        monkeypatch.setattr(toy, "make_toy_wrapper", make_toy_block_wrapper)

    def test_gradient_does_not_depend_on_the_partition(self, spec):
        """The contract's partition check on the block toy, in this process (micro-batches of 1, 2
        and all 4 rows of different lengths); the block toy's BD3LM log-probs are float32, hence
        1e-5. The 2-rank half needs the check to build the block toy in its spawned ranks."""
        whole = partition_gradient((dare_plugin_ebpo,), "ebpo", {}, 4)
        scale = max(1.0, max(float(x.abs().max()) for x in whole))
        assert any(bool(x.abs().sum() > 0) for x in whole)
        for micro in (1, 2):
            parts = partition_gradient((dare_plugin_ebpo,), "ebpo", {}, micro)
            assert max(float((a - b).abs().max()) for a, b in zip(whole, parts)) <= 1e-5 * scale, micro


def _components(**cfg):
    return algorithm_components((dare_plugin_ebpo,), "ebpo", **cfg)


def test_sequence_loss_oracle():
    old = torch.tensor([-100.0, -50.0, -80.0, -10.0])
    new = torch.tensor([-99.0, -50.5, -80.0, -9.0])
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    loss, m = ebpo_sequence_loss(new, old, adv, torch.ones(4, dtype=torch.bool))
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 0.5 + 2 * math.e) / 4, abs=1e-6)
    assert loss.item() == pytest.approx(1.1341408, abs=1e-6)
    assert m["pg_clipfrac"] == 0.5 and m["pg_clipfrac_lower"] == 0.25
    assert m["ppo_kl"] == pytest.approx(-0.375)
    # invalid rows are excluded from the mean
    loss2, _ = ebpo_sequence_loss(new, old, adv, torch.tensor([True, True, False, False]))
    assert loss2.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)


def test_ratio_one_reduces_to_minus_mean_advantage_and_gradient():
    e = torch.tensor([-5.0, -7.0], requires_grad=True)
    adv = torch.tensor([1.0, -0.5])
    loss, _ = ebpo_sequence_loss(e, e.detach(), adv, torch.ones(2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == pytest.approx(-0.25)
    torch.testing.assert_close(e.grad, -adv / 2)


def test_invalid_rows_with_nan_reach_neither_loss_nor_gradient():
    # reference (dllm_core_algos.compute_policy_loss_ebpo): valid rows are selected before exp
    new = torch.tensor([-99.0, float("nan"), -80.0, float("inf")], requires_grad=True)
    old = torch.tensor([-100.0, float("nan"), -80.0, 0.0])
    adv = torch.tensor([1.0, float("nan"), 0.5, -2.0])
    valid = torch.tensor([True, False, True, False])
    loss, m = ebpo_sequence_loss(new, old, adv, valid)
    loss.backward()
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2, abs=1e-6)
    torch.testing.assert_close(new.grad, torch.tensor([0.0, 0.0, -0.25, 0.0]))
    assert m["ratio_nonfinite"] == 0.0 and m["pg_clipfrac"] == 0.5


def test_half_precision_inputs_are_computed_in_float32():
    new = torch.tensor([-99.0, -50.5, -80.0, -9.0])
    old = torch.tensor([-100.0, -50.0, -80.0, -10.0])
    adv, valid = torch.tensor([1.0, -1.0, 0.5, -2.0]), torch.ones(4, dtype=torch.bool)
    e = new.to(torch.bfloat16).requires_grad_(True)
    loss, _ = ebpo_sequence_loss(e, old.to(torch.bfloat16), adv.to(torch.bfloat16), valid)
    ref, _ = ebpo_sequence_loss(new, old, adv, valid)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(ref.item(), abs=1e-6)
    loss.backward()
    assert e.grad.dtype == torch.bfloat16


def test_input_checks_are_one_line_errors():
    x, valid = torch.zeros(3), torch.ones(3, dtype=torch.bool)
    with pytest.raises(DareError, match=r"\[B\]"):
        ebpo_sequence_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(DareError, match=r"\[B\]"):
        ebpo_sequence_loss(x, torch.zeros(4), x, valid)
    with pytest.raises(DareError, match="at least one sequence"):
        ebpo_sequence_loss(x, x, x, torch.zeros(3, dtype=torch.bool))
    with pytest.raises(DareError, match="reference ELBOs"):
        EBPOLoss(kl_coef=0.1)(torch.zeros(2, 3), torch.zeros(2, 3), None, x, torch.ones(3, 4))


def test_global_totals_make_micro_batch_shares_sum_to_the_mini_batch_loss():
    # one row without a response token (excluded from N), rows of different lengths
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(6)[None] < torch.tensor([6, 3, 0, 5, 1])[:, None]).float()
    rows = torch.randn(4, 5, generator=g, dtype=torch.float64) - 5
    old, ref = rows.mean(0) + 0.3 * torch.randn(5, generator=g, dtype=torch.float64), rows - 0.2
    adv = torch.tensor([1.0, -0.5, 0.3, -1.0, 2.0], dtype=torch.float64)
    loss = EBPOLoss(kl_coef=0.1, kl_type="k2")

    def grad(parts):
        e = rows.clone().requires_grad_(True)
        T = sum_totals([loss.totals(mask[i]) for i in parts])
        assert T["rows"].item() == 4.0
        total = sum(loss(e[:, i], old[None, i], ref[:, i], adv[i], mask[i], totals=T)[0] for i in parts)
        total.backward()
        return total.detach(), e.grad

    whole = grad([torch.arange(5)])
    for parts in ([torch.arange(5)[i : i + 1] for i in range(5)], [torch.tensor([0, 1]), torch.tensor([2, 3, 4])]):
        torch.testing.assert_close(grad(parts), whole, atol=1e-12, rtol=1e-12)


def _oracle_batch():
    # P-section 5 holding 4 valid prompt tokens, 7 valid response tokens (R = 8)
    ids = torch.arange(20, 33)[None].repeat(2, 1)
    att = torch.ones(2, 13, dtype=torch.long)
    att[:, 0] = 0
    att[:, 12] = 0
    return SequenceBatch(ids, att, 5)


def test_block_counts_oracle_global_origin():
    batch = _oracle_batch()
    blocks = BlockELBOMasking(block_length=4).response_blocks(batch, 4)[0, 5:]
    assert blocks.tolist() == [1, 1, 1, 1, 2, 2, 2, -1]  # blocks of 4 and 3 response tokens
    sizes = torch.tensor([4, 3])
    tau = torch.tensor([[0.0, 0.5], [0.99, 0.25]], dtype=torch.float64)
    k = block_mask_counts(tau, sizes[None])
    assert k.tolist() == [[1, 2], [4, 1]]
    torch.testing.assert_close(k / sizes, torch.tensor([[1 / 4, 2 / 3], [1.0, 1 / 3]]))


def test_first_response_block_can_share_the_prompt_tail():
    ids = torch.arange(20, 30)[None]
    batch = SequenceBatch(ids, torch.ones_like(ids), 3)  # 3 prompt tokens, 7 response tokens
    blocks = BlockELBOMasking(block_length=4).response_blocks(batch, 4)[0, 3:]
    assert blocks.tolist() == [0, 1, 1, 1, 1, 2, 2]  # a 1-token first block


def test_corruption_every_block_every_row_and_stratified_levels():
    w = make_toy_block_wrapper()
    batch = _oracle_batch()
    c = BlockELBOMasking(mc_num=8, n_l=4)(w, batch, torch.Generator().manual_seed(0))
    assert c.masked.shape == (8, 2, 13)
    assert not c.masked[:, :, :5].any()
    resp = c.masked[:, :, 5:]
    for blk in (slice(0, 4), slice(4, 7)):
        n = blk.stop - blk.start
        k = resp[:, :, blk].sum(-1)
        assert (k >= 1).all()
        p = c.p_mask[:, :, 5:][:, :, blk]
        torch.testing.assert_close(p.max(-1).values, k.float() / n)
        tau = c.extras["levels"][:, :, 5 + blk.start]
        torch.testing.assert_close(k, torch.minimum(torch.floor(tau.double() * n).long() + 1, torch.tensor(n)))
    # one group of 4 rows x 2 blocks = 8 cells: levels are u + c/8 mod 1, i.e. evenly spaced
    lv = torch.cat([c.extras["levels"][:4, 0, 5], c.extras["levels"][:4, 0, 9]]).sort().values
    gaps = torch.diff(lv)
    torch.testing.assert_close(gaps, torch.full_like(gaps, 1 / 8), atol=1e-6, rtol=0)
    assert (c.noisy_ids[c.masked] == w.mask_token_id).all()


class UniformBlockWrapper:
    kind = "block"
    block_size = 4
    mask_token_id = 2

    def token_logprobs(self, noisy, targets, attention_mask=None, clean_ids=None, prompt_len=None):
        assert clean_ids is not None  # the block layout needs the clean half
        return torch.full(targets.shape, -math.log(3.0))

    def noise(self, ids, where, generator):  # the absorbing kernel
        return torch.where(where, torch.full_like(ids, self.mask_token_id), ids)


def test_composite_elbo_uniform_logits_is_minus_L_c():
    comps = _components(mc_num=4, n_l=2)
    batch = _oracle_batch()
    w = UniformBlockWrapper()
    c = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    rows = comps.estimator(w, batch, c)
    torch.testing.assert_close(rows, torch.full((4, 2), -7 * math.log(3.0)))


def test_estimator_uses_the_bd3lm_layout_on_the_block_toy():
    comps = _components(mc_num=2, n_l=2)
    w = make_toy_block_wrapper()
    batch = _oracle_batch()
    c = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    rows = comps.estimator(w, batch, c)
    for m in range(2):
        logits = w.denoise_logits(c.noisy_ids[m], batch.attention_mask, batch.input_ids).float()
        lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[..., None])[..., 0]
        sel = c.masked[m] & batch.attention_mask.bool()
        expect = (torch.where(sel, lp / c.p_mask[m].clamp_min(1e-12), torch.zeros(()))).sum(-1)
        torch.testing.assert_close(rows[m], expect, rtol=1e-5, atol=1e-5)
    # the clean half matters: without it (inference mask) the values differ
    other = w.token_logprobs(c.noisy_ids[0], batch.input_ids, batch.attention_mask)
    full = w.token_logprobs(c.noisy_ids[0], batch.input_ids, batch.attention_mask, clean_ids=batch.input_ids)
    assert not torch.allclose(other[c.masked[0]], full[c.masked[0]])


def test_proxy_accumulation_equals_full_gradient_on_block_toy():
    comps = _components(mc_num=4, n_l=4, kl_coef=0.1, kl_type="k2")
    w = make_toy_block_wrapper()
    batch = _oracle_batch()
    c = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    with torch.no_grad():
        old = comps.estimator(w, batch, c) + 0.1
        ref = old - 0.3
    m, m2 = check_accumulate_matches_backward(comps, w, batch, c, old, ref, torch.tensor([1.0, -0.7]))
    assert m2["kl_loss"] == pytest.approx(m["kl_loss"], rel=1e-5) and m2["elbo_mc_var"] > 0


def test_needs_a_block_size():
    w = make_toy_block_wrapper()
    w.block_size = None
    with pytest.raises(DareError, match="block_length"):
        BlockELBOMasking()(w, _oracle_batch(), torch.Generator())


def test_config_validators():
    _, problems = structure(EBPOConfig, {"n_l": 5, "kl_type": "k9", "block_length": -1}, "algorithm")
    assert len(problems) == 3


def test_one_rl_step_on_the_block_toy(tmp_path):
    rec = one_rl_step(
        (toy_block, dare_plugin_ebpo),
        "ebpo",
        "block_toy",
        tmp_path,
        ["algorithm.mc_num=4", "algorithm.n_l=2"],
        gen_length=8,
    )
    assert rec["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert rec["pg_clipfrac"] == 0.0 and rec["elbo_nonfinite"] == 0.0 and rec["grad_norm"] > 0
