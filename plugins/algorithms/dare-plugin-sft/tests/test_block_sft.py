"""Block-diffusion SFT (arXiv:2503.09573) on the family-free block toy, against hand computations."""

from __future__ import annotations

import pytest
import torch

import dare_plugin_sft
from dare_core.components import ComponentLookup, RandomRatioMasking
from dare_core.config.structure import structure
from dare_core.interfaces import Corrupted, SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.registries import build_for
from dare_nn.block import bd3lm_mask, block_index
from dare_nn.testing.toy_block import make_toy_block_wrapper
from dare_plugin_sft.block import BlockDiffusionMasking, BlockDiffusionNELBO, choose_masks
from dare_plugin_sft.objective import SFTConfig, make_collate


@pytest.fixture(scope="module")
def components():
    dare = build_for(dare_plugin_sft)
    spec = dare.registries.algorithms.get("sft")
    cfg, problems = structure(spec.config_cls, {})
    assert not problems
    return spec.build(cfg, ComponentLookup(dare.registries, components=spec.components))


def _batch(w):
    collate = make_collate(SFTConfig(response_length=7))
    return collate([[10, 11, 12, 13, 14], [20, 21]], [[30, 31, 32], [40, 41, 42, 43, 44, 45]], w)


def test_choose_masks_retry_rule():
    eligible = torch.tensor([[False, True, True, True], [True, True, False, False], [False] * 4])
    t = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.6, 0.9]])  # [T=2, N=3]
    draws = torch.tensor(
        [
            [[0.0, 0.9, 0.9, 0.9], [0.7, 0.1, 0.0, 0.0], [0.0] * 4],  # try 0: row0 none, row1 pos 1
            [[0.0, 0.9, 0.3, 0.9], [0.0, 0.0, 0.0, 0.0], [0.0] * 4],  # try 1: row0 none either
        ]
    )
    masked, tt = choose_masks(t, draws, eligible, torch.tensor([0.7, 0.0, 0.5]))
    # row 0: no try hits -> last try's t (0.2) and the floor(0.7 * 3) = 2nd eligible (position 3) forced
    assert masked[0].tolist() == [False, False, False, True] and tt[0].item() == pytest.approx(0.2)
    # row 1: first try hits (0.1 < 0.5 at position 1)
    assert masked[1].tolist() == [False, True, False, False] and tt[1].item() == pytest.approx(0.5)
    # row 2: nothing eligible, nothing masked
    assert not masked[2].any()


def test_block_corruption_masks_only_trained_response_tokens():
    w = make_toy_block_wrapper()
    batch = _batch(w)
    c = BlockDiffusionMasking(eps=1e-3, mc_num=3)(w, batch, torch.Generator().manual_seed(0))
    assert c.noisy_ids.shape == (3, 2, batch.input_ids.shape[1])
    eligible = torch.zeros_like(batch.input_ids, dtype=torch.bool)
    eligible[:, batch.prompt_len :] = batch.response_mask.bool()
    assert not (c.masked & ~eligible).any()
    assert c.masked.any(-1).all()  # at least one per row
    assert torch.equal(c.noisy_ids[c.masked], torch.full((int(c.masked.sum()),), w.mask_token_id))
    assert torch.equal(c.noisy_ids[~c.masked], batch.input_ids.expand(3, -1, -1)[~c.masked])
    p = c.extras["t"]
    assert ((p >= 1e-3) & (p <= 1.0)).all()
    torch.testing.assert_close(c.p_mask, torch.where(eligible, p[:, :, None], torch.zeros(())).float())
    # EOS padding is trained (pad_with_eos), so it counts in the answer length
    assert c.extras["answer_len"][0].tolist() == [7, 7]
    narrow = BlockDiffusionMasking(low=0.3, high=0.8, eps=0.0)(w, batch, torch.Generator().manual_seed(1))
    assert ((narrow.extras["t"] >= 0.3) & (narrow.extras["t"] <= 0.8)).all()


def test_block_loss_hand_computed():
    logp = torch.tensor([[[0.0, -1.0, -2.0, 0.0], [0.0, 0.0, -0.5, 0.0]]])
    masked = torch.tensor([[[False, True, True, False], [False, False, True, False]]])
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.5], [0.0, 0.25, 0.25, 0.25]]])
    c = Corrupted(
        torch.zeros(1, 2, 4, dtype=torch.long),
        masked,
        p,
        {"t": torch.tensor([[0.5, 0.25]]), "answer_len": torch.tensor([[3.0, 3.0]])},
    )
    batch = SequenceBatch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), 1)
    loss, m = BlockDiffusionNELBO()(logp, c, batch)  # 6 trained response tokens
    assert loss.item() == pytest.approx((1.0 / 0.5 + 2.0 / 0.5 + 0.5 / 0.25) / 6, rel=1e-6)
    assert m["masked_tokens"] == 3 and m["nll"] == pytest.approx(3.5 / 3)
    plain, _ = BlockDiffusionNELBO("none")(logp, c, batch)
    assert plain.item() == pytest.approx(3.5 / 6, rel=1e-6)
    # normalised by the step's tokens when given: here twice this batch's
    half, _ = BlockDiffusionNELBO()(logp, c, batch, totals={"tokens": torch.tensor(12.0, dtype=torch.float64)})
    assert half.item() == pytest.approx(loss.item() / 2, rel=1e-6)


def test_sft_dispatches_on_the_model_kind(components):
    # masked models: exactly the core random-ratio corruption and the masked NELBO (unchanged path)
    w = make_toy_wrapper()
    batch = _batch(w)
    a = components.corruption(w, batch, torch.Generator().manual_seed(0))
    b = RandomRatioMasking(eps=1e-3)(w, batch, torch.Generator().manual_seed(0))
    assert torch.equal(a.noisy_ids, b.noisy_ids) and "answer_len" not in a.extras
    # block models: the block corruption and loss
    wb = make_toy_block_wrapper()
    c = components.corruption(wb, _batch(wb), torch.Generator().manual_seed(0))
    assert "answer_len" in c.extras


def test_block_sft_step_equals_hand_computed_bd3lm_loss(components):
    """Loss through the components == Σ CE/p / answer_len from an explicit [noisy | clean] forward."""
    w = make_toy_block_wrapper(seed=2)
    batch = _batch(w)
    c = components.corruption(w, batch, torch.Generator().manual_seed(3))
    logp = components.estimator(w, batch, c)
    loss, _ = components.loss(logp, c, batch)
    ids, att = batch.input_ids, batch.attention_mask
    B, L = ids.shape
    pos = (att.cumsum(1) - 1).clamp_min(0) * att
    mask = bd3lm_mask(block_index(pos, 4), att)
    noisy = c.noisy_ids[0]
    with torch.no_grad():
        logits = w.module(
            torch.cat([noisy, ids], 1), attention_mask=mask, position_ids=torch.cat([pos, pos], 1)
        ).logits[:, :L]
    lsm = torch.log_softmax(logits.float(), -1)
    total = 0.0
    for b in range(B):
        for j in range(L):
            if c.masked[0, b, j]:
                total += -float(lsm[b, j, ids[b, j]]) / float(c.p_mask[0, b, j])
    answer = float(batch.response_mask.sum())
    assert loss.item() == pytest.approx(total / answer, rel=1e-5)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in w.module.parameters())


def test_block_options_validated():
    _, problems = structure(SFTConfig, {"block_weighting": "x"})
    assert problems
    _, problems = structure(SFTConfig, {"block_t_low": 0.9, "block_t_high": 0.1})
    assert problems and "block_t_low" in problems[0]
