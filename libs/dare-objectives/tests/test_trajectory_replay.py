"""Core trajectory pieces: replayed states, block-local steps, transition weights, the sampler's
step-state record and resumed partial denoising (family- and algorithm-free)."""

import pytest
import torch

from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_objectives.trajectory_replay import (
    block_local_steps,
    replay_states,
    response_block_ids,
    transition_weights,
)
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

# three blocks of four response tokens with these block-local steps
LOCAL = torch.tensor([[0, 0, 1, 1, 0, 1, 2, 2, 0, 0, 0, 0]])
BLOCKS = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]])


def test_transition_weights_oracle():
    w = transition_weights(LOCAL, BLOCKS, 3).double()
    expect_tok = [1 / 12] * 4 + [1 / 6, 1 / 6, 1 / 12, 1 / 12] + [1 / 24] * 4
    torch.testing.assert_close(w.sum(0)[0], torch.tensor(expect_tok, dtype=torch.float64))
    torch.testing.assert_close(w.sum((1, 2)), torch.tensor([1 / 2, 1 / 3, 1 / 6], dtype=torch.float64))
    assert w.sum().item() == pytest.approx(1.0, rel=1e-12)
    assert ((w > 0) == (LOCAL[None] == torch.arange(3)[:, None, None])).all()


def test_block_local_steps_dense_rank_and_noncontiguous_global_steps():
    # global reveal steps with gaps (e.g. steps 4..7 for the second block) → local 0.. per block
    order = torch.tensor([[0, 0, 1, 1, 4, 6, 7, 7, 8, 8, 8, 8]])
    assert torch.equal(block_local_steps(order, BLOCKS), LOCAL)
    order[0, 3] = -1  # never committed stays -1
    assert block_local_steps(order, BLOCKS)[0, 3] == -1


def test_response_block_ids_use_the_global_grid_from_the_first_real_token():
    ids = torch.zeros(1, 10, dtype=torch.long)
    att = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1]])
    blk = response_block_ids(SequenceBatch(ids, att, 5), 4)
    # prompt: 3 real tokens (compact 0..2); response compact positions 3..7
    assert blk.tolist() == [[0, 1, 1, 1, 1]]


def test_resumed_partial_denoising_equals_one_run():
    w = make_toy_wrapper()
    sampler = LowConfidenceSampler(LowConfidenceConfig(gen_length=8, block_length=4, steps=6, temperature=1.0))
    prompts = torch.randint(4, 60, (2, 4), generator=torch.Generator().manual_seed(0))
    pmask = torch.ones_like(prompts)
    pmask[0, 0] = 0
    full = sampler.generate(
        w, prompts, pmask, record=frozenset({"reveal_step"}), generator=torch.Generator().manual_seed(5)
    )
    g = torch.Generator().manual_seed(5)
    start = torch.full((2, 8), w.mask_token_id)
    half = sampler.continue_from(w, prompts, pmask, start, start_step=0, stop_step=4, generator=g)
    assert (half.response_ids == w.mask_token_id).any()  # block 1 entered mid-way: masks left
    rest = sampler.continue_from(w, prompts, pmask, half.response_ids, start_step=4, stop_step=6, generator=g)
    assert torch.equal(rest.response_ids, full.response_ids)
    reveal = torch.where(rest.reveal_step >= 0, rest.reveal_step, half.reveal_step)
    assert torch.equal(reveal, full.reveal_step)


def test_replay_states_oracle():
    ids = torch.tensor([[5, 6, 10, 11, 12]])
    batch = SequenceBatch(ids, torch.ones_like(ids), 2)
    order = torch.tensor([[1, -1, 0]])
    cor, steps = replay_states(batch, order, mask_token_id=2)
    assert steps.tolist() == [0, 1]
    assert cor.noisy_ids[:, 0].tolist() == [[5, 6, 2, 2, 2], [5, 6, 2, 2, 12]]
    assert cor.masked[:, 0].tolist() == [[False, False, False, False, True], [False, False, True, False, False]]
    cor, steps = replay_states(batch, order, 2, targets=torch.tensor([[True, True, False]]))
    assert steps.tolist() == [1]  # step 0 commits no target: skipped
    assert cor.noisy_ids[0, 0].tolist() == [5, 6, 2, 2, 12]  # ... but its token is clean later


def test_step_states_record():
    w = make_toy_wrapper()
    sampler = LowConfidenceSampler(LowConfidenceConfig(gen_length=8, block_length=4, steps=4, temperature=1.0))
    prompts = torch.randint(4, 60, (3, 5), generator=torch.Generator().manual_seed(0))
    roll = sampler.generate(
        w,
        prompts,
        torch.ones_like(prompts),
        record=frozenset({"step_states", "reveal_step"}),
        generator=torch.Generator().manual_seed(1),
    )
    inputs, preds, conf = (roll.extras[k] for k in ("step_inputs", "step_predictions", "step_confidence"))
    assert inputs.shape == preds.shape == conf.shape == (3, 4, 8)
    assert (inputs[:, 0] == w.mask_token_id).all() and not (preds == w.mask_token_id).any()
    kept = inputs != w.mask_token_id
    assert torch.equal(preds[kept], inputs[kept])
    for k in range(4):  # the state before step k = tokens revealed at steps < k
        revealed = (roll.reveal_step < k) & (roll.reveal_step >= 0)
        assert torch.equal(inputs[:, k] != w.mask_token_id, revealed)
        hit = roll.reveal_step == k  # committed tokens are the step's predictions
        assert torch.equal(roll.response_ids[hit], preds[:, k][hit])
    assert ((conf > 0) & (conf <= 1)).all()
    plain = sampler.generate(w, prompts, torch.ones_like(prompts), generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain.response_ids, roll.response_ids)  # recording changes nothing here
