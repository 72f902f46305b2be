"""Coupled-GRPO (arXiv:2506.20639): corruption oracles, uniform-logit estimator oracle, loss
oracles, contract, masks drawn once per rollout batch, block-diffusion layout."""

import math
import random

import pytest
import torch

import dare_plugin_coupled_grpo
from dare_core.config.structure import structure
from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.rl_probe import assert_one_draw_per_batch, components_of, spy_run
from dare_plugin_coupled_grpo.algorithm import CoupledConfig, CoupledMasking, CoupledTokenLogProb

T42 = 0.5836560790747303


class TestCoupledContract(AlgorithmContract):
    algorithm = "coupled_grpo"
    plugins = (dare_plugin_coupled_grpo,)


def _components(**cfg):
    return components_of(dare_plugin_coupled_grpo, "coupled_grpo", **cfg)


def _batch(B=3, P=6, R=8, pad=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 40, (B, P + R), generator=g)
    att = torch.ones(B, P + R, dtype=torch.long)
    att[0, :pad] = 0
    ids[0, :pad] = 0
    att[1, -2:] = 0  # right padding of the second response
    return SequenceBatch(ids, att, P)


def test_fixed_seed_reproduces_reference_and_leaves_global_rngs_alone():
    w = make_toy_wrapper()
    batch = _batch()
    torch.manual_seed(123)
    random.seed(7)
    expect_torch = torch.rand(3)
    expect_py = random.random()
    torch.manual_seed(123)
    random.seed(7)
    c1 = CoupledMasking(seed_mode="fixed")(w, batch, torch.Generator().manual_seed(0))
    c2 = CoupledMasking(seed_mode="fixed")(w, batch, torch.Generator().manual_seed(99))
    # global streams untouched (the reference reset them to 42 on every call)
    torch.testing.assert_close(torch.rand(3), expect_torch)
    assert random.random() == expect_py
    assert c1.extras["t"][0, 0].item() == pytest.approx(T42, abs=1e-7)
    for a, b in ((c1.noisy_ids, c2.noisy_ids), (c1.masked, c2.masked), (c1.p_mask, c2.p_mask)):
        assert torch.equal(a, b)
    # the reference's uniforms: torch.rand((1, S)) right after manual_seed(42), the same for every row
    u = torch.rand((1, batch.input_ids.shape[1]), generator=torch.Generator().manual_seed(42))[0]
    resp = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    resp[:, 6:] = batch.response_mask.bool()
    assert torch.equal(c1.masked[1], resp & (u < T42)[None])


def test_rows_partition_the_valid_response_with_p_mask():
    w = make_toy_wrapper()
    batch = _batch()
    for mode in ("fixed", "stream"):
        c = CoupledMasking(seed_mode=mode)(w, batch, torch.Generator().manual_seed(1))
        resp = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
        resp[:, 6:] = batch.response_mask.bool()
        assert torch.equal(c.masked[0], resp)
        assert not (c.masked[1] & c.masked[2]).any()
        assert torch.equal(c.masked[1] | c.masked[2], resp)
        t = c.extras["t"][0]
        assert ((t >= 0.2) & (t <= 0.8)).all()
        for b in range(3):
            m1, m2 = c.masked[1, b], c.masked[2, b]
            assert torch.allclose(c.p_mask[1, b][m1], t[b].expand(int(m1.sum())))
            assert torch.allclose(c.p_mask[2, b][m2], (1 - t[b]).expand(int(m2.sum())))
        assert (c.p_mask[0][resp] == 1).all() and (c.p_mask[:, ~resp] == 0).all()
        assert (c.noisy_ids[c.masked] == w.mask_token_id).all()
        assert torch.equal(c.noisy_ids[~c.masked], batch.input_ids.expand(3, -1, -1)[~c.masked])


def test_default_draws_fresh_masks_every_step():
    """DiffuCoder's code draws new masks per batch; 'fixed' (one mask per run) is the reference's."""
    assert CoupledConfig().seed_mode == "stream"
    assert _components().remask_each_epoch and not _components(seed_mode="fixed").remask_each_epoch
    w, batch = make_toy_wrapper(), _batch()
    corrupt = _components().corruption
    steps = [corrupt(w, batch, torch.Generator().manual_seed(s)) for s in (0, 1)]
    assert not torch.equal(steps[0].masked, steps[1].masked)
    assert not torch.equal(steps[0].extras["t"], steps[1].extras["t"])
    fixed = _components(seed_mode="fixed").corruption
    assert torch.equal(
        fixed(w, batch, torch.Generator().manual_seed(0)).masked,
        fixed(w, batch, torch.Generator().manual_seed(1)).masked,
    )


def test_stream_mode_uses_the_run_generator():
    w = make_toy_wrapper()
    batch = _batch()
    m = CoupledMasking(seed_mode="stream")
    a = m(w, batch, torch.Generator().manual_seed(1))
    b = m(w, batch, torch.Generator().manual_seed(1))
    c = m(w, batch, torch.Generator().manual_seed(2))
    assert torch.equal(a.masked, b.masked)
    assert not torch.equal(a.extras["t"], c.extras["t"])
    assert len(set(a.extras["t"][0].tolist())) == 3  # one ratio per sequence


def test_uniform_logits_oracle():
    """All-zero logits: ℓ = −(c + c/t)/2 on the t-set and −(c + c/(1−t))/2 on the complement."""
    w = make_toy_wrapper()
    with torch.no_grad():
        w.module.head.weight.zero_()
        w.module.head.bias.zero_()
    V = w.module.head.out_features
    c = math.log(V)
    batch = _batch(pad=0)
    batch.attention_mask[:] = 1
    cor = CoupledMasking(seed_mode="fixed")(w, batch, torch.Generator())
    lp = CoupledTokenLogProb()(w, batch, cor)[0]
    m1 = cor.masked[1, :, 6:]
    torch.testing.assert_close(lp[m1], torch.full_like(lp[m1], -(c + c / T42) / 2))
    torch.testing.assert_close(lp[~m1], torch.full_like(lp[~m1], -(c + c / (1 - T42)) / 2))


@pytest.mark.parametrize("kind", ["masked", "block"])
def test_estimator_matches_direct_computation(kind):
    """Masked wrappers score each row directly; block wrappers score it as the noisy half of
    ``[noisy | clean]`` with the final sequence as the clean half."""
    from dare_nn.testing.toy_block import make_toy_block_wrapper

    w = make_toy_wrapper() if kind == "masked" else make_toy_block_wrapper()
    batch = _batch(pad=2 if kind == "masked" else 0)
    if kind == "block":
        batch.attention_mask[:] = 1
    cor = CoupledMasking(seed_mode="stream")(w, batch, torch.Generator().manual_seed(3))
    lp = CoupledTokenLogProb()(w, batch, cor)
    assert lp.shape == (1, 3, 8)
    rows = []
    for m in range(3):
        logits = w.denoise_logits(cor.noisy_ids[m], batch.attention_mask, batch.input_ids).float()
        rows.append(torch.log_softmax(logits, -1).gather(-1, batch.input_ids[..., None])[..., 0][:, 6:])
    t = cor.extras["t"][0][:, None]
    m1, m2 = cor.masked[1, :, 6:], cor.masked[2, :, 6:]
    expect = (rows[0] + torch.where(m1, rows[1] / t, 0) + torch.where(m2, rows[2] / (1 - t), 0)) / 2
    torch.testing.assert_close(lp[0], expect, rtol=1e-5, atol=1e-5)


def test_loss_oracles_ratio_one_and_clipped_case():
    comps = _components()
    A = torch.tensor([0.5, -1.0])
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    old = torch.tensor([[[-1.0, -2, -3], [-0.5, -0.7, -0.9]]])
    loss, m = comps.loss(old.clone(), old, None, A, mask)
    assert loss.item() == pytest.approx(0.4, abs=1e-6)
    assert m["pg_clipfrac"] == 0 and m["ppo_kl"] == pytest.approx(0.0, abs=1e-7)
    new = old + torch.tensor([[[0.3, -0.3, 0], [0.3, -0.3, 2.0]]])
    loss, m = comps.loss(new, old, None, A, mask)
    assert loss.item() == pytest.approx(0.8358899, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.4)
    assert m["ppo_kl"] == pytest.approx(0.2633379, abs=1e-6)
    assert m["pg_clipfrac_lower"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    "kind,expect",
    [
        ("k1", [0.5, -0.5]),
        ("k2", [0.125, 0.125]),
        ("k3", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5]),
        ("dare_log1p_k1", [0.405465, -0.5]),
        ("dare_log1p_k2", [0.082201, 0.125]),
        ("dare_log1p_k3", [0.072132, 0.148721]),
    ],
)
def test_kl_branch_oracles(kind, expect):
    """KL estimators on d = ℓ - ℓ_ref, and the DARE reference's rule (log(1+d) for A > 0, d
    otherwise), one token per sequence, token-mean."""
    comps = _components(kl_coef=1.0, kl_type=kind)
    assert comps.needs_ref
    lp = torch.tensor([[[-1.0], [-1.0]]])
    ref = torch.tensor([[[-1.5], [-0.5]]])
    _, m = comps.loss(lp, lp, ref, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    assert m["kl_loss"] == pytest.approx(sum(expect) / 2, abs=1e-5)
    with pytest.raises(ValueError):
        comps.loss(lp, lp, None, torch.tensor([1.0, -1.0]), torch.ones(2, 1))


def test_config_invariants_are_validators():
    _, problems = structure(CoupledConfig, {"t_low": 0.7, "t_high": 0.5}, "algorithm")
    assert len(problems) == 1 and "t_low" in problems[0]
    _, problems = structure(CoupledConfig, {"seed_mode": "global", "clip_ratio_c": 0.5}, "algorithm")
    assert len(problems) == 2


@pytest.mark.parametrize("reuse,passes", [(False, 2), (True, 1)])
def test_masks_drawn_once_per_rollout_batch_shared_by_old_ref_new(tmp_path, reuse, passes):
    log = spy_run(
        tmp_path,
        dare_plugin_coupled_grpo,
        "coupled_grpo",
        toy,
        [
            "rollout.gen_length=4",
            "rollout.block_length=4",
            "rollout.steps=4",
            "algorithm.seed_mode=stream",
            "algorithm.kl_coef=0.1",
            f"trainer.reuse_logprob={reuse}",
        ],
    )
    assert_one_draw_per_batch(log, steps=2)
    # with a reference model: old (unless taken from the update's forward), ref (no grad) and
    # new (grad) calls per micro-batch
    n_nograd = sum(1 for e in log.events if e[0] == "estimate" and not e[1])
    assert n_nograd == 2 * passes * 3  # 2 steps x (old + ref, or ref) x 3 micro-batches of 8 rows
