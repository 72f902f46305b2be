"""ELBO building blocks: stratified-count oracles (VRPO, arXiv:2505.19223; ESPO, arXiv:2512.03759),
subset masking, the sequence ELBO under uniform logits (-L log V), row selection, and exactness of
the two accumulation schemes."""

import math

import pytest
import torch

from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_objectives.elbo import (
    RowMeanObjective,
    SequenceELBO,
    StratifiedCountMasking,
    clipped_surrogate,
    cyclic_levels,
    cyclic_stratified_counts,
    mc_diagnostics,
    per_row_backward,
    random_subset,
    ratio_diagnostics,
    sequence_elbo,
    sequence_kl,
)


class UniformWrapper:
    """Every token has probability 1/V whatever the input: log p = -log V."""

    kind = "masked"
    mask_token_id = 2

    def __init__(self, vocab=2):
        self.c = math.log(vocab)

    def token_logprobs(self, noisy, targets, attention_mask=None, clean_ids=None, prompt_len=None):
        return torch.full(targets.shape, -self.c)

    def noise(self, ids, where, generator):  # the absorbing kernel
        return torch.where(where, torch.full_like(ids, self.mask_token_id), ids)


@pytest.mark.parametrize(
    "k,L,n,expected",
    [
        (3, 10, 4, [3, 6, 8, 10]),
        (9, 10, 4, [9, 2, 4, 6]),
        (1, 7, 16, [1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6, 7, 7, 1]),
        (200, 256, 16, [200, 216, 232, 248] + list(range(8, 185, 16))),
    ],
)
def test_per_group_counts_oracle(k, L, n, expected):
    assert cyclic_stratified_counts(k, L, n, offset=1).tolist() == expected


def test_across_batch_counts_oracle():
    assert cyclic_stratified_counts(3, 11, 4, offset=0).tolist() == [3, 6, 8, 0]
    assert cyclic_stratified_counts(0, 5, 3, offset=0).tolist() == [0, 2, 3]


def test_cyclic_levels():
    torch.testing.assert_close(cyclic_levels(0.9, 4), torch.tensor([0.9, 0.15, 0.4, 0.65], dtype=torch.float64))


def test_random_subset_exact_counts_and_uniform():
    g = torch.Generator().manual_seed(0)
    valid = torch.tensor([[0, 1, 1, 1, 0, 1]], dtype=torch.bool).expand(6000, 6)
    counts = torch.full((6000,), 2)
    m = random_subset(valid, counts, g)
    assert (m.sum(-1) == 2).all() and not (m & ~valid).any()
    freq = m.float().mean(0)[valid[0]]
    assert torch.allclose(freq, torch.full_like(freq, 0.5), atol=0.03)
    with pytest.raises(ValueError):
        random_subset(valid[:1], torch.tensor([5]), g)


def _batch(B=3, P=4, R=6, pad_last=2):
    ids = torch.randint(10, 40, (B, P + R), generator=torch.Generator().manual_seed(1))
    att = torch.ones(B, P + R, dtype=torch.long)
    att[0, :1] = 0  # left padding
    att[1, P + R - pad_last :] = 0  # right padding
    return SequenceBatch(ids, att, P)


def test_stratified_count_masking_rows():
    batch = _batch()
    c = StratifiedCountMasking(mc_num=8, n_l=4)(UniformWrapper(), batch, torch.Generator().manual_seed(0))
    L = batch.response_mask.sum(-1)
    counts = c.extras["counts"]
    assert c.masked.shape == (8, 3, 10)
    assert not c.masked[:, :, :4].any()
    assert (c.masked.sum(-1) == counts).all()
    assert ((counts >= 1) & (counts <= L[None])).all()
    for g in range(2):  # each group is a cyclic stratification of 1..L
        grp = counts[4 * g : 4 * g + 4, 1]
        assert len(set(grp.tolist())) >= 3
    p = c.p_mask[:, :, 4:]
    torch.testing.assert_close(p[:, 1, :4], (counts[:, 1].float() / L[1])[:, None].expand(8, 4))
    assert (p[:, 1, 4:] == 0).all()
    assert (c.noisy_ids[c.masked] == UniformWrapper.mask_token_id).all()


def test_uniform_logits_elbo_is_minus_L_c_for_any_count():
    batch = _batch()
    w = UniformWrapper(vocab=2)
    c = StratifiedCountMasking(mc_num=8, n_l=8)(w, batch, torch.Generator().manual_seed(0))
    L = batch.response_mask.sum(-1).float()
    raw = SequenceELBO("none")(w, batch, c)
    torch.testing.assert_close(raw, (-L * w.c)[None].expand(8, 3))
    torch.testing.assert_close(SequenceELBO("padded")(w, batch, c), raw / 6)
    torch.testing.assert_close(SequenceELBO("valid")(w, batch, c), raw / L)
    w.kind = "block"
    torch.testing.assert_close(SequenceELBO("auto")(w, batch, c), raw / L)


def test_sequence_elbo_hand_computed():
    logp = torch.tensor([[[-1.0, -2.0, -4.0]]])
    masked = torch.tensor([[[True, False, True]]])
    p = torch.tensor([[[0.5, 0.5, 0.25]]])
    assert sequence_elbo(logp, masked, p).item() == pytest.approx(-1 / 0.5 - 4 / 0.25)
    # composite over two rows with per-token values already divided (EBPO, arXiv:2602.08676): -3
    e = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([True, True, False])
    assert sequence_elbo(e[:, None], mask.expand(2, 3)[:, None], torch.ones(2, 1, 3)).mean().item() == -3.0


def test_select_samples_rows_and_extras():
    batch = _batch()
    c = StratifiedCountMasking(mc_num=4, n_l=4)(UniformWrapper(), batch, torch.Generator().manual_seed(0))
    c.extras["per_batch"] = torch.arange(3)
    s = c.select_samples([2])
    assert s.noisy_ids.shape == (1, 3, 10)
    assert torch.equal(s.masked[0], c.masked[2]) and torch.equal(s.extras["counts"][0], c.extras["counts"][2])
    assert torch.equal(s.extras["per_batch"], torch.arange(3))


def test_clipped_surrogate_branches():
    ratio = torch.tensor([1.3, 0.7, 1.3, 5.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped, dual = clipped_surrogate(ratio, adv, 0.2, 0.2, 3.0)
    torch.testing.assert_close(loss, torch.tensor([-1.2, -0.7, 1.3, 3.0]))
    assert clipped.tolist() == [True, False, False, False] and dual.tolist() == [False, False, False, True]
    loss, _, _ = clipped_surrogate(ratio, adv, 0.2, 0.2, None)
    assert loss[3].item() == 5.0


def test_sequence_kl_forms():
    e, r = torch.tensor([-100.0, -50.0]), torch.tensor([-98.0, -51.0])
    torch.testing.assert_close(sequence_kl(e, r, "k2") / 256, torch.tensor([0.0078125, 0.0019531]), atol=1e-7, rtol=0)
    torch.testing.assert_close(sequence_kl(e, r, "k1"), torch.tensor([-2.0, 1.0]))
    torch.testing.assert_close(
        sequence_kl(e, r, "k3"), torch.exp(torch.tensor([2.0, -1.0])) + torch.tensor([-3.0, 0.0])
    )


def test_diagnostics():
    rows = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    d = mc_diagnostics(rows)
    assert d["elbo_nonfinite"] == 1.0
    assert mc_diagnostics(torch.tensor([[1.0, 2.0], [3.0, 2.0]]))["elbo_mc_var"] == pytest.approx((2.0 + 0.0) / 2)
    assert mc_diagnostics(torch.tensor([[1.0, 2.0]]))["elbo_mc_var"] == 0.0
    r = ratio_diagnostics(torch.tensor([0.5, 2.0, float("inf")]), torch.tensor([1.0, 3.0, 1.0]))
    assert r == {"ratio_nonfinite": 1.0, "ratio_mean": pytest.approx(1.625), "ratio_min": 0.5, "ratio_max": 2.0}


def _toy_setup(M=4):
    w = make_toy_wrapper(seed=0)
    batch = _batch(B=3, P=4, R=6)
    c = StratifiedCountMasking(mc_num=M, n_l=M)(w, batch, torch.Generator().manual_seed(0))
    est = SequenceELBO("padded")

    def estimate(rows):
        return est(w, batch, c.select_samples(rows))

    return w, batch, c, est, estimate


def _grads(w):
    out = [p.grad.clone() for p in w.module.parameters()]
    w.module.zero_grad(set_to_none=False)
    return out


class SquaredGap(RowMeanObjective):
    def objective(self, elbo, rows, old_rows, ref_rows, advantages, mask, *, totals):
        loss = ((elbo - old_rows.mean(0)) ** 2 * advantages + elbo.exp() * 0.1).sum() / totals["rows"]
        return loss, {"n": float(rows.shape[0])}


def test_proxy_backward_equals_full_graph_gradient():
    w, batch, c, est, estimate = _toy_setup()
    old = estimate(list(range(4))).detach() - 0.3
    adv = torch.tensor([1.0, -0.5, 2.0])
    obj = SquaredGap()
    mask = torch.ones(3, 2)
    loss_full, _ = obj(estimate(list(range(4))), old, None, adv, mask)
    (loss_full * 0.5).backward()
    full = _grads(w)
    loss_acc, metrics = obj.accumulate(estimate, 4, old, None, adv, mask, 0.5)
    acc = _grads(w)
    assert loss_acc.item() == pytest.approx(loss_full.item(), rel=1e-5)
    assert metrics["n"] == 4.0
    for a, b in zip(full, acc):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in acc)


def test_per_row_backward_equals_mean_of_row_losses():
    w, batch, c, est, estimate = _toy_setup()
    weights = torch.tensor([1.0, -2.0, 0.5])

    def row_loss(e, m):
        return (e * weights).sum() * (m + 1), {"m": float(m)}

    rows = estimate(list(range(4)))
    full = sum(row_loss(rows[m], m)[0] for m in range(4)) / 4
    (full * 2.0).backward()
    g_full = _grads(w)
    loss, metrics = per_row_backward(estimate, 4, row_loss, 2.0)
    g_acc = _grads(w)
    assert loss.item() == pytest.approx(full.item(), rel=1e-5)
    assert metrics["m"] == pytest.approx(1.5)
    for a, b in zip(g_full, g_acc):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
