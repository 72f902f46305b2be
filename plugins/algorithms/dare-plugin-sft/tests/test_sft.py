"""SFT: NELBO against hand-computed values, the step normalisation of every SFT loss, EOS-padding
collate, contract."""

import math

import pytest
import torch

import dare_plugin_sft
from dare_core.api import sum_totals
from dare_core.interfaces import Corrupted, SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.contracts import AlgorithmContract
from dare_plugin_sft.block import BlockDiffusionNELBO
from dare_plugin_sft.objective import NELBOLoss, SFTConfig, make_collate
from dare_plugin_sft.uniform import UniformDiffusionCE


class TestSFTContract(AlgorithmContract):
    algorithm = "sft"
    plugins = (dare_plugin_sft,)


def test_nelbo_hand_computed():
    logp = torch.tensor([[[0.0, -1.0, -2.0, 0.0], [0.0, 0.0, -0.5, 0.0]]])
    masked = torch.tensor([[[False, True, True, False], [False, False, True, False]]])
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.5], [0.0, 0.25, 0.25, 0.25]]])
    c = Corrupted(torch.zeros(1, 2, 4, dtype=torch.long), masked, p)
    batch = SequenceBatch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), 1)
    loss, m = NELBOLoss()(logp, c, batch)
    expected = (1.0 / 0.5 + 2.0 / 0.5 + 0.5 / 0.25) / 6  # / the 6 trained response tokens
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert m["nll"] == pytest.approx(3.5 / 3)
    assert m["masked_tokens"] == 3


def test_nelbo_no_masked_tokens_is_zero_not_nan():
    c = Corrupted(torch.zeros(1, 1, 3, dtype=torch.long), torch.zeros(1, 1, 3, dtype=torch.bool), torch.zeros(1, 1, 3))
    batch = SequenceBatch(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[1, 0, 0]]), 1)
    loss, _ = NELBOLoss()(torch.zeros(1, 1, 3), c, batch)
    assert loss.item() == 0.0 and not math.isnan(loss.item())


def test_collate_pads_with_trained_eos_or_ignored_pad():
    w = make_toy_wrapper()
    b = make_collate(SFTConfig(response_length=5))([[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14, 15, 16]], w)
    assert b.prompt_len == 3
    assert b.input_ids[1].tolist() == [w.pad_token_id, w.pad_token_id, 8, 11, 12, 13, 14, 15]
    assert b.response_ids[0].tolist() == [9, 10, w.eos_token_id, w.eos_token_id, w.eos_token_id]
    assert b.response_mask.tolist() == [[1] * 5, [1] * 5]
    b2 = make_collate(SFTConfig(pad_with_eos=False))([[5]], [[9]], w)
    b3 = make_collate(SFTConfig(pad_with_eos=False))([[5], [6]], [[9], [9, 9]], w)
    assert b2.response_mask.tolist() == [[1]]
    assert b3.response_mask.tolist() == [[1, 0], [1, 1]] and b3.response_ids[0, 1] == w.pad_token_id


def test_sft_gradient_matches_weighted_ce():
    w = make_toy_wrapper()
    ids = torch.randint(10, 40, (2, 7))
    batch = SequenceBatch(ids, torch.ones_like(ids), 3)
    from dare_core.components import MaskedTokenLogProb, RandomRatioMasking

    c = RandomRatioMasking(mc_num=1)(w, batch, torch.Generator().manual_seed(3))
    logp = MaskedTokenLogProb()(w, batch, c)
    loss, _ = NELBOLoss()(logp, c, batch)
    logits = w.logits(c.noisy_ids[0])
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    manual = (ce * c.masked[0] / c.p_mask[0].clamp_min(1e-12)).sum() / batch.response_mask.sum()
    torch.testing.assert_close(loss, manual, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "loss_fn",
    [NELBOLoss(), BlockDiffusionNELBO("elbo"), BlockDiffusionNELBO("none"), UniformDiffusionCE()],
    ids=["nelbo", "block-elbo", "block-none", "uniform"],
)
def test_loss_is_the_step_loss_for_every_split(loss_fn):
    """Calls on parts of the rows with the summed totals add up to the whole batch's loss and
    gradient (fp64), on rows of different lengths, two Monte-Carlo rows."""
    g = torch.Generator().manual_seed(0)
    B, P, R, M = 7, 2, 5, 2
    lengths = torch.tensor([5, 1, 3, 0, 4, 2, 5])
    att = torch.cat([torch.ones(B, P, dtype=torch.long), (torch.arange(R) < lengths[:, None]).long()], 1)
    batch = SequenceBatch(torch.zeros(B, P + R, dtype=torch.long), att, P)
    valid = torch.zeros(B, P + R, dtype=torch.bool)
    valid[:, P:] = batch.response_mask.bool()
    t = torch.rand(M, B, generator=g, dtype=torch.float64) * 0.9 + 0.1
    masked = (torch.rand(M, B, P + R, generator=g, dtype=torch.float64) < t[:, :, None]) & valid
    p_mask = torch.where(valid, t[:, :, None], torch.zeros((), dtype=torch.float64))
    c = Corrupted(
        torch.zeros(M, B, P + R, dtype=torch.long),
        masked,
        p_mask,
        {"t": t, "answer_len": valid.sum(-1).double().expand(M, B)},
    )
    full = -torch.rand(M, B, P + R, generator=g, dtype=torch.float64)
    logp = full[:, :, P:] if isinstance(loss_fn, UniformDiffusionCE) else full * masked

    def run(parts):
        x = logp.clone().requires_grad_(True)
        T = sum_totals([loss_fn.totals(batch.select(i)) for i in parts])
        total = sum(loss_fn(x[:, i], c.select(i), batch.select(i), totals=T)[0] for i in parts)
        total.backward()
        return total.detach(), x.grad

    whole, grad = run([torch.arange(B)])
    torch.testing.assert_close(whole, loss_fn(logp, c, batch)[0], rtol=0, atol=1e-12)
    assert whole.abs() > 0
    for size in (1, 2, 3):
        got, g_got = run(list(torch.randperm(B, generator=g).split(size)))
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)
        torch.testing.assert_close(g_got, grad, rtol=0, atol=1e-12)
