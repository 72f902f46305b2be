"""SFT: NELBO against hand-computed values, EOS-padding collate, contract."""

import math

import pytest
import torch

import dare_plugin_sft
from dare_core.interfaces import Corrupted, SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.contracts import AlgorithmContract
from dare_plugin_sft.objective import NELBOLoss, SFTConfig, make_collate


class TestSFTContract(AlgorithmContract):
    algorithm = "sft"
    plugins = (dare_plugin_sft,)


def test_nelbo_hand_computed():
    logp = torch.tensor([[[0.0, -1.0, -2.0, 0.0], [0.0, 0.0, -0.5, 0.0]]])
    masked = torch.tensor([[[False, True, True, False], [False, False, True, False]]])
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.5], [0.0, 0.25, 0.25, 0.25]]])
    c = Corrupted(torch.zeros(1, 2, 4, dtype=torch.long), masked, p)
    loss, m = NELBOLoss()(logp, c, None)
    expected = (1.0 / 0.5 + 2.0 / 0.5 + 0.5 / 0.25) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert m["nll"] == pytest.approx(3.5 / 3)
    assert m["masked_tokens"] == 3


def test_nelbo_no_masked_tokens_is_zero_not_nan():
    c = Corrupted(torch.zeros(1, 1, 3, dtype=torch.long), torch.zeros(1, 1, 3, dtype=torch.bool), torch.zeros(1, 1, 3))
    loss, _ = NELBOLoss()(torch.zeros(1, 1, 3), c, None)
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
    manual = (ce * c.masked[0] / c.p_mask[0].clamp_min(1e-12)).sum() / c.masked.sum()
    torch.testing.assert_close(loss, manual, rtol=1e-5, atol=1e-6)
