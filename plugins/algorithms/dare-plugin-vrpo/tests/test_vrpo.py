"""VRPO (arXiv:2505.19223): DPO oracle (arXiv:2305.18290), hand-computed metrics, the effective β/R
normalisation on a uniform-logit model, stratified counts, shared (antithetic)
noise between policy and reference, a gradient step in the right direction, and the contract."""

import copy
import math

import pytest
import torch

import dare_plugin_vrpo
from dare_core.api import sum_totals
from dare_core.components import ComponentLookup
from dare_core.config.structure import structure
from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.registries import build_for
from dare_core.testing.toy import fake_rollout
from dare_plugin_vrpo.algorithm import DPOLoss, VRPOConfig
from dare_plugin_vrpo.algorithm import build as build_vrpo


class TestVRPOContract(AlgorithmContract):
    algorithm = "vrpo"
    plugins = (dare_plugin_vrpo,)


def _components(**cfg):
    dare = build_for(dare_plugin_vrpo)
    spec = dare.registries.algorithms.get("vrpo")
    return build_vrpo(VRPOConfig(**cfg), ComponentLookup(dare.registries, components=spec.components))


def test_dpo_oracle_and_policy_equals_reference():
    loss_fn = DPOLoss(beta=0.2)
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.5]])
    loss, m = loss_fn(logp, ref)
    assert loss.item() == pytest.approx(0.5981389, abs=1e-6)  # = -log sigmoid(0.2)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.2))), abs=1e-7)
    assert m["reward_chosen"] == pytest.approx(0.1) and m["reward_rejected"] == pytest.approx(-0.1)
    assert m["reward_margin"] == pytest.approx(0.2) and m["reward_accuracy"] == 1.0
    assert m["logp_margin"] == pytest.approx(1.0)
    same, m2 = loss_fn(ref, ref)
    assert same.item() == pytest.approx(math.log(2), abs=1e-7) and m2["reward_accuracy"] == 0.0


def test_dpo_is_the_step_loss_for_every_split():
    """Pairs are counted over the step: calls on parts (whole pairs) with the summed totals add up
    to the whole batch's mean loss and gradient (fp64)."""
    g = torch.Generator().manual_seed(0)
    N, M = 7, 3
    logp = -torch.rand(M, 2 * N, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(M, 2 * N, generator=g, dtype=torch.float64) * 4
    batch = SequenceBatch(torch.zeros(2 * N, 3, dtype=torch.long), torch.ones(2 * N, 3, dtype=torch.long), 1)
    loss_fn = DPOLoss(beta=0.3)

    def run(pair_parts):
        x = logp.clone().requires_grad_(True)
        rows = [torch.stack([2 * p, 2 * p + 1], 1).reshape(-1) for p in pair_parts]
        T = sum_totals([loss_fn.totals(batch.select(r)) for r in rows])
        total = sum(loss_fn(x[:, r], ref[:, r], batch.select(r), totals=T)[0] for r in rows)
        total.backward()
        return total.detach(), x.grad

    whole, grad = run([torch.arange(N)])
    torch.testing.assert_close(whole, loss_fn(logp, ref, batch)[0], rtol=0, atol=1e-12)
    for size in (1, 2, 3):
        got, g_got = run(list(torch.randperm(N, generator=g).split(size)))
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)
        torch.testing.assert_close(g_got, grad, rtol=0, atol=1e-12)


def test_dpo_averages_monte_carlo_rows_then_pairs():
    # two pairs, M = 2 rows whose means are the oracle values of pair 0 and a mirrored pair 1
    logp = torch.tensor([[-0.5, -2.5, -3.0, -1.0], [-1.5, -1.5, -1.0, -1.0]])
    ref = torch.full((2, 4), -1.5)
    loss, m = DPOLoss(beta=0.2)(logp, ref)
    z = torch.tensor([1.0, -1.0])  # pair 0: (-1) - (-2); pair 1: (-2) - (-1)
    expected = -torch.nn.functional.logsigmoid(0.2 * z).mean().item()
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["reward_accuracy"] == 0.5 and m["reward_margin"] == pytest.approx(0.0, abs=1e-7)
    # MC diagnostics: per-sequence unbiased variance over the 2 rows, averaged over 4 sequences
    var = torch.tensor([0.5, 0.5, 2.0, 0.0]).mean().item()
    assert m["elbo_mc_var"] == pytest.approx(var)
    with pytest.raises(ValueError, match="interleaved pairs"):
        DPOLoss()(torch.zeros(1, 3), torch.zeros(1, 3))


class UniformWrapper:
    """Every token has probability 1/V: log p = -log V at every position (no parameters)."""

    def __init__(self, vocab=7):
        self.c = math.log(vocab)
        self.mask_token_id = 2
        self.kind = "masked"

    def token_logprobs(self, noisy, targets, attention_mask=None, clean_ids=None, prompt_len=None):
        return torch.full(targets.shape, -self.c)

    def noise(self, ids, where, generator):  # the absorbing kernel
        return torch.where(where, torch.full_like(ids, self.mask_token_id), ids)


def test_elbo_is_exact_on_uniform_logits_and_normalised_by_padded_length():
    w = UniformWrapper()
    P, R = 3, 6
    ids = torch.randint(3, 7, (4, P + R))
    att = torch.ones_like(ids)
    lengths = [6, 4, 1, 3]
    for b, L in enumerate(lengths):
        att[b, P + L :] = 0
    batch = SequenceBatch(ids, att, P)
    for normalize, denom in (("padded", [R] * 4), ("valid", lengths), ("none", [1] * 4)):
        comps = _components(mc_num=8, n_l=4, normalize=normalize)
        c = comps.corruption(w, batch, torch.Generator().manual_seed(1))
        est = comps.estimator(w, batch, c)
        assert est.shape == (8, 4)
        expected = torch.tensor([-L * w.c / d for L, d in zip(lengths, denom)])
        torch.testing.assert_close(est, expected[None].expand(8, 4), rtol=1e-6, atol=1e-6)


def test_stratified_counts_per_group():
    w = UniformWrapper()
    P, L = 2, 10
    ids = torch.randint(3, 7, (3, P + L))
    batch = SequenceBatch(ids, torch.ones_like(ids), P)
    comps = _components(mc_num=8)  # n_l = mc_num: one stratified group of 8
    c = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    counts = c.masked[:, :, P:].sum(-1)  # [M, B]
    assert not c.masked[:, :, :P].any()  # prompts are never masked
    for b in range(3):
        k = int(counts[0, b])
        x = torch.round(torch.linspace(k, k + 7 * L / 8, 8, dtype=torch.float64)).long()
        assert counts[:, b].tolist() == (((x - 1) % L) + 1).tolist()
        torch.testing.assert_close(c.p_mask[:, b, P:], (counts[:, b].float() / L)[:, None].expand(8, L))
    # the recipe oracle: L=10, n=4, k=3 -> [3, 6, 8, 10]; k=9 -> [9, 2, 4, 6]
    for k, want in ((3, [3, 6, 8, 10]), (9, [9, 2, 4, 6])):
        x = torch.round(torch.linspace(k, k + 3 * 10 / 4, 4, dtype=torch.float64)).long()
        assert (((x - 1) % 10) + 1).tolist() == want


def test_shared_noise_gives_exactly_log2_and_fresh_noise_does_not():
    """Policy == reference: with the corruption shared (antithetic), every pair's ELBO
    difference cancels and the loss is exactly log 2; independent noise would not cancel."""
    comps = _components(mc_num=2)
    policy = make_toy_wrapper()
    reference = copy.copy(policy)
    reference.module = copy.deepcopy(policy.module)
    batch = fake_rollout(policy, batch=4, response_len=8).sequences()
    shared = comps.corruption(policy, batch, torch.Generator().manual_seed(0))
    with torch.no_grad():
        pol = comps.estimator(policy, batch, shared)
        ref = comps.estimator(reference, batch, shared)
        loss, _ = comps.loss(pol, ref, batch)
        assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
        other = comps.corruption(policy, batch, torch.Generator().manual_seed(1))
        ref2 = comps.estimator(reference, batch, other)
        loss2, _ = comps.loss(pol, ref2, batch)
    assert abs(loss2.item() - math.log(2)) > 1e-4


def test_one_step_raises_the_margin_under_the_same_noise():
    comps = _components(mc_num=4, normalize="none", beta=1.0)
    policy = make_toy_wrapper()
    ref_module = copy.deepcopy(policy.module)
    batch = fake_rollout(policy, batch=4, response_len=8).sequences()
    c = comps.corruption(policy, batch, torch.Generator().manual_seed(0))
    reference = copy.copy(policy)
    reference.module = ref_module
    with torch.no_grad():
        ref = comps.estimator(reference, batch, c)
    opt = torch.optim.SGD(policy.module.parameters(), lr=0.05)
    loss, m0 = comps.loss(comps.estimator(policy, batch, c), ref, batch)
    loss.backward()
    opt.step()
    with torch.no_grad():
        loss1, m1 = comps.loss(comps.estimator(policy, batch, c), ref, batch)
    assert loss1.item() < loss.item()
    assert m1["reward_margin"] > m0["reward_margin"] == 0.0


def test_config_errors():
    _, problems = structure(VRPOConfig, {"mc_num": 4, "n_l": 3, "beta": 0}, "algorithm")
    assert "algorithm.n_l: must divide mc_num=4 (null = mc_num), got 3" in problems
    assert "algorithm.beta: must be > 0, got 0.0" in problems
    _, problems = structure(VRPOConfig, {"normalize": "tokens"}, "algorithm")
    assert problems and problems[0].startswith("algorithm.normalize: expected one of")
