"""BGPO (arXiv:2510.11683): loss oracles, the NaN guard, exact per-row accumulation, a peak
memory measurement over mc_num, the contract, and one RL step through the core loop."""

import math

import pytest
import torch

import dare_plugin_bgpo
from dare_core.config.structure import structure
from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.algorithm_checks import algorithm_components, check_accumulate_matches_backward, one_rl_step
from dare_core.testing.contracts import AlgorithmContract
from dare_core.workflows.rl import _row_estimate
from dare_objectives.elbo import StratifiedCountMasking
from dare_plugin_bgpo.algorithm import BGPOConfig, BGPOLoss, bgpo_surrogate

A = torch.tensor([[0.5] * 3, [-1.0] * 3])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])


class TestBGPOContract(AlgorithmContract):
    algorithm = "bgpo"
    plugins = (dare_plugin_bgpo,)


def _components(**cfg):
    return algorithm_components((dare_plugin_bgpo,), "bgpo", **cfg)


def test_ratio_one_gives_minus_token_mean_advantage():
    loss, m, _ = bgpo_surrogate(OLD.clone(), OLD, A, MASK)
    assert loss.item() == pytest.approx(0.4, abs=1e-6)
    assert m["pg_clipfrac"] == 0.0 and m["ppo_kl"] == pytest.approx(0.0, abs=1e-7)


def test_oracle_linear_ratio_for_positive_advantages():
    new = OLD + torch.tensor([[0.3, -0.3, 0.0], [0.3, -0.3, 2.0]])
    loss, m, ratio = bgpo_surrogate(new, OLD, A, MASK)
    assert loss.item() == pytest.approx(0.8399717, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.4)
    assert m["ppo_kl"] == pytest.approx(-0.3811378, abs=1e-6)
    assert m["pg_clipfrac_lower"] == pytest.approx(0.2)
    # A > 0 uses 1 ± 0.3, not e^{±0.3}; A < 0 uses e^Δ
    torch.testing.assert_close(ratio[0, :2], torch.tensor([1.3, 0.7]))
    torch.testing.assert_close(ratio[1, :2], torch.exp(torch.tensor([0.3, -0.3])))


def test_nan_case_reference_vs_guard():
    old, new, adv, mask = torch.zeros(1, 1), torch.full((1, 1), -1.5), torch.ones(1, 1), torch.ones(1, 1)
    loss, m, _ = bgpo_surrogate(new, old, adv, mask, nan_guard=False)
    assert math.isnan(loss.item())  # the reference's log(1 - 1.5)
    assert m["ratio_nonpositive"] == 1.0
    new.requires_grad_(True)
    loss, m, _ = bgpo_surrogate(new, old, adv, mask, nan_guard=True)
    # the linear surrogate itself: below 1 - ε the A > 0 branch is not clipped, -A(1 + Δ) = 0.5
    assert loss.item() == pytest.approx(0.5)
    assert m["ratio_nonpositive"] == 1.0
    loss.backward()
    assert new.grad.item() == pytest.approx(-1.0)  # -A ∇ℓ, finite


def test_row_loss_broadcasts_and_is_length_weighted():
    loss_fn = BGPOLoss()
    l_new = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-1.1, -2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    loss, m = loss_fn(l_new, old, None, torch.tensor([1.0, -1.0]), mask)
    # row 0: ρ = 1 + 0.1 (A > 0) -> -1.1 on 3 tokens; row 1: ρ = 1 -> +1 on 1 token
    assert loss.item() == pytest.approx((3 * -1.1 + 1.0) / 4, abs=1e-6)
    assert m["ratio_max"] == pytest.approx(1.1) and m["elbo_mc_var"] == 0.0


def test_kl_uses_one_row_against_reference_row_mean():
    loss_fn = BGPOLoss(kl_coef=0.5, kl_type="dare_log1p_k1")
    lp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-1.5, -0.5], [-1.5, -0.5]])  # row mean = [-1.5, -0.5]
    base, _ = BGPOLoss()(lp, lp, None, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    loss, m = loss_fn(lp, lp, ref, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    # kl_penalty oracle (DARE reference rule), k1: [log 1.5, -0.5] (log(1 + d) only where A > 0)
    assert m["kl_loss"] == pytest.approx((0.405465 - 0.5) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(base.item() + 0.5 * m["kl_loss"], abs=1e-6)
    assert _components(kl_coef=0.1).needs_ref and not _components().needs_ref


def test_corruption_and_estimator_match_uniform_oracle_on_toy():
    comps = _components(mc_num=4, n_l=4)
    assert isinstance(comps.corruption, StratifiedCountMasking)
    w = make_toy_wrapper()
    ids = torch.randint(10, 40, (2, 9))
    batch = SequenceBatch(ids, torch.ones_like(ids), 5)
    c = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    logp = comps.estimator(w, batch, c)
    lp = torch.log_softmax(w.logits(c.noisy_ids[1]).float(), -1).gather(-1, ids[..., None])[..., 0][:, 5:]
    x = c.extras["counts"][1].float()
    expect = (lp * c.masked[1, :, 5:]).sum(-1) * (4 / x) / 4  # Σ log p / (x/L), normalised by R = 4
    torch.testing.assert_close(logp[1], expect)


def _setup(M, seed=0):
    w = make_toy_wrapper(seed=seed, dim=32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, 40, (8, 48), generator=g)
    batch = SequenceBatch(ids, torch.ones_like(ids), 8)
    c = StratifiedCountMasking(M, M)(w, batch, torch.Generator().manual_seed(2))
    comps = _components(mc_num=M, n_l=M)
    with torch.no_grad():
        old = comps.estimator(w, batch, c) + 0.05 * torch.randn(M, 8, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, 0.0])
    return w, batch, c, comps, old, adv


def test_accumulate_equals_one_backward_gradient():
    w, batch, c, comps, old, adv = _setup(4)
    _, metrics = check_accumulate_matches_backward(comps, w, batch, c, old, None, adv)
    assert metrics["elbo_mc_var"] > 0


class SavedTensorMeter:
    """Peak bytes of distinct storages held by autograd graphs (saved for backward).

    CPU torch keeps no allocator peak statistics; what grows with the number of Monte-Carlo
    graphs alive is exactly this saved-activation memory."""

    def __init__(self):
        self.live: dict[int, list] = {}
        self.peak = 0

    def _total(self):
        return sum(v[0] for v in self.live.values())

    def pack(self, t):
        key = t.untyped_storage().data_ptr()
        entry = self.live.setdefault(key, [t.untyped_storage().nbytes(), 0])
        entry[1] += 1
        self.peak = max(self.peak, self._total())
        return _Held(t, key, self)

    def release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]


class _Held:
    def __init__(self, t, key, meter):
        self.t, self.key, self.meter = t, key, meter

    def __del__(self):
        self.meter.release(self.key)


def _peak(M, accumulate):
    w, batch, c, comps, old, adv = _setup(M)
    mask = batch.response_mask.float()
    meter = SavedTensorMeter()
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda h: h.t):
        if accumulate:
            comps.loss.accumulate(_row_estimate(comps.estimator, w, batch, c), M, old, None, adv, mask, 1.0)
        else:
            loss, _ = comps.loss(comps.estimator(w, batch, c), old, None, adv, mask)
            loss.backward()
    assert not meter.live  # every graph was freed
    return meter.peak


def test_peak_memory_does_not_grow_with_mc_num():
    small, large = _peak(2, True), _peak(8, True)
    assert large <= small * 1.05, (small, large)
    # the measurement can see growth: keeping all rows' graphs grows with mc_num
    naive_small, naive_large = _peak(2, False), _peak(8, False)
    assert naive_large > 3 * naive_small, (naive_small, naive_large)
    assert large < naive_large / 3


def test_config_validators():
    _, problems = structure(
        BGPOConfig, {"mc_num": 16, "n_l": 5, "clip_ratio_c": 1.0, "length_norm": "half"}, "algorithm"
    )
    assert len(problems) == 3 and any("n_l" in p for p in problems)
    cfg, problems = structure(BGPOConfig, {}, "algorithm")
    assert not problems and cfg.mc_num == 16 and cfg.n_l == 16


def test_one_rl_step_through_the_core_loop(tmp_path):
    rec = one_rl_step((toy, dare_plugin_bgpo), "bgpo", "toy", tmp_path, ["algorithm.mc_num=4", "algorithm.n_l=2"])
    assert rec["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # shared corruption: ratio 1 at the first update
    assert rec["elbo_nonfinite"] == 0.0 and rec["ratio_nonpositive"] == 0.0 and "elbo_mc_var" in rec
    assert rec["grad_norm"] > 0
