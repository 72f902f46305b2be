"""CJ-GRPO (arXiv:2509.23924): the paper-reduction oracles, exact replay of the sampler's states
(masked path), block-parallel replay = serial per-(block, step) replay on the block toy (block
path), loss reductions, chunked backward, contract, states built once per rollout batch."""

import pytest
import torch

import dare_plugin_cj_grpo
from dare_core.errors import DareError
from dare_core.interfaces import RolloutBatch
from dare_core.interfaces.rows import TrajectoryContext
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.rl_probe import (
    ProbePlugin,
    assert_one_draw_per_batch,
    components_of,
    spy_run,
    tiny_rl_run,
)
from dare_nn.testing import toy_block
from dare_nn.testing.toy_block import make_toy_block_wrapper
from dare_objectives.replay_loss import ReplayClippedLoss, make_replay_clipped_loss
from dare_objectives.trajectory_replay import (
    StepReplay,
    transition_weights,
)
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

# the "231" fixture: three blocks of four response tokens with these block-local steps
LOCAL = torch.tensor([[0, 0, 1, 1, 0, 1, 2, 2, 0, 0, 0, 0]])
BLOCKS = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]])


class TestCJContract(AlgorithmContract):
    algorithm = "cj_grpo"
    plugins = (dare_plugin_cj_grpo,)


def _components(**cfg):
    return components_of(dare_plugin_cj_grpo, "cj_grpo", **cfg)


def _context(B, adv=None):
    adv = torch.zeros(B) if adv is None else adv
    return TrajectoryContext(torch.zeros(B), adv, torch.arange(B), lambda *a: torch.zeros(B))


def _reduce(x, w, mode):
    """``ReplayClippedLoss``'s reduction of ``x`` over the totals of ``w`` (all rows: one batch)."""
    den = ReplayClippedLoss._den(ReplayClippedLoss.totals(None, w), mode, slice(None), x.shape[0])
    return ReplayClippedLoss._reduce(x, w, mode, 3, den)


def test_paper_reduction_is_27_17_and_differs_from_step_mean():
    const = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 10.0, (1, 1): 20.0, (1, 2): 30.0, (2, 0): 100.0}
    vals = torch.tensor([[const[(int(b), int(k))] for b, k in zip(BLOCKS[0], LOCAL[0])]], dtype=torch.float64)
    x = vals[None].expand(3, 1, 12)
    w = transition_weights(LOCAL, BLOCKS, 3)
    paper = _reduce(x, w, "per_sample")
    assert paper.item() == pytest.approx(27.1666667, abs=1e-6)
    targets = (LOCAL[None] == torch.arange(3)[:, None, None]).double()
    step_mean = _reduce(x, targets, "step_mean")
    assert step_mean.item() == pytest.approx(32.2857143, abs=1e-6)
    # ratio 1 with token advantages: loss = -Σ w A
    adv = torch.tensor([[0.9, -0.4, 0.3, -0.8, 1.1, -0.6, 0.7, -0.2, 0.5, -1.0, 0.4, -0.3]], dtype=torch.float64)
    loss = _reduce(-adv[None].expand(3, 1, 12), w, "per_sample")
    assert loss.item() == pytest.approx(-0.1083333, abs=1e-6)


def test_masked_replay_reproduces_the_sampler_states_and_confidences():
    """Greedy low-confidence rollout with recorded step states: the replayed state before every
    step is the sampler's state, and the replayed log-prob of each committed token is the log of
    the sampler's (untempered) confidence in it (up to the sampler's exclusion of the mask token)."""
    w = make_toy_wrapper()
    prompts = torch.randint(4, 60, (3, 5), generator=torch.Generator().manual_seed(0))
    pmask = torch.ones_like(prompts)
    pmask[0, :2] = 0
    prompts[0, :2] = w.pad_token_id
    sampler = LowConfidenceSampler(LowConfidenceConfig(gen_length=8, block_length=4, steps=8, temperature=0.0))
    roll = sampler.generate(w, prompts, pmask, record=frozenset({"reveal_step", "step_states"}))
    rows = StepReplay().rows(w, roll, _context(3))
    assert rows.corrupted.num_samples == 8 and (rows.extras["replay_steps"] == 8).all()
    P = rows.batch.prompt_len
    torch.testing.assert_close(rows.corrupted.noisy_ids[:, :, P:], roll.extras["step_inputs"].transpose(0, 1))
    with torch.no_grad():
        lp = _components().estimator(w, rows.batch, rows.corrupted)
    conf = roll.extras["step_confidence"].transpose(0, 1)
    tgt = rows.corrupted.masked[:, :, P:]
    # the sampler never proposes the mask token, so its confidence is renormalised without it
    with torch.no_grad():
        p_mask = torch.stack(
            [
                torch.softmax(w.logits(s, rows.batch.attention_mask).float(), -1)[:, P:, w.mask_token_id]
                for s in rows.corrupted.noisy_ids
            ]
        )
    torch.testing.assert_close(lp[tgt], conf[tgt].float().log() + torch.log1p(-p_mask[tgt]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rows.weights, tgt.float())


def _block_fixture():
    """One row: prompt of 4 tokens (one block), response of 12 tokens with the 231 local steps."""
    w = make_toy_block_wrapper()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(4, 60, (1, 4), generator=g)
    resp = torch.randint(4, 60, (1, 12), generator=g)
    reveal = LOCAL + 3 * BLOCKS  # global steps of a 3-step-per-block sampler (block 1 used all 3)
    roll = RolloutBatch(prompt, torch.ones_like(prompt), resp, torch.ones_like(resp), reveal_step=reveal, num_steps=9)
    return w, roll


def test_block_parallel_replay_equals_serial_per_block_replay():
    w, roll = _block_fixture()
    rows = StepReplay().rows(w, roll, _context(1))
    assert rows.corrupted.num_samples == 3  # one forward per local step for all blocks
    assert int(rows.extras["replay_reduction"][0]) == 1  # per-sample paper reduction
    batch = rows.batch
    est = _components().estimator
    par = est(w, batch, rows.corrupted)[:, 0]  # [3, 12]
    P, mask_id = batch.prompt_len, w.mask_token_id
    for blk in range(3):
        for k in range(3):
            sel = (BLOCKS[0] == blk) & (LOCAL[0] == k)
            if not sel.any():
                continue
            # serial: only this block is partially revealed; every other block fully masked
            noisy = batch.input_ids.clone()
            resp = noisy[:, P:]
            keep = (BLOCKS[0] == blk) & (LOCAL[0] < k)
            resp[:, ~keep] = mask_id
            lp = torch.log_softmax(w.denoise_logits(noisy, batch.attention_mask, batch.input_ids).float(), -1)
            serial = lp.gather(-1, batch.input_ids[..., None])[0, P:, 0]
            torch.testing.assert_close(par[k][sel], serial[sel], rtol=1e-5, atol=1e-6)


def test_block_path_replays_the_whole_terminal_block():
    w, roll = _block_fixture()
    roll.response_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]])  # stop inside block 1
    rows = StepReplay().rows(w, roll, _context(1))
    att = rows.batch.attention_mask[0, 4:]
    assert att.tolist() == [1] * 8 + [0] * 4  # block 1 replayed to its end, block 2 dropped
    assert rows.weights.sum().item() == pytest.approx(1.0, rel=1e-6)
    assert (rows.weights[:, 0, 8:] == 0).all()


def test_left_to_right_check_and_missing_record_errors():
    w = make_toy_wrapper()
    resp = torch.randint(4, 60, (1, 4))
    p = torch.randint(4, 60, (1, 3))
    roll = RolloutBatch(
        p, torch.ones_like(p), resp, torch.ones_like(resp), reveal_step=torch.tensor([[1, 0, 2, 3]]), num_steps=4
    )
    with pytest.raises(DareError, match="left-to-right"):
        StepReplay(left_to_right=True).rows(w, roll, _context(1))
    roll.reveal_step = None
    with pytest.raises(DareError, match="reveal_step"):
        StepReplay().rows(w, roll, _context(1))


def test_step_mean_loss_hand_computed():
    """Two steps, K = 4 rollout steps: (1/4)(token-mean step 0 + token-mean step 1)."""
    loss_fn = make_replay_clipped_loss()
    old = torch.zeros(2, 2, 3)
    new = old.clone()
    new[0, 0, 0] = 0.1  # A=1 > 0, r = e^0.1 < 1.2 → -1.10517
    adv = torch.tensor([1.0, -0.5])
    w = torch.tensor([[[1.0, 0, 0], [0, 1, 0]], [[0, 0, 1], [0, 0, 0]]])
    extras = {"replay_reduction": torch.tensor([0, 0]), "replay_steps": torch.tensor([4, 4])}
    loss, m = loss_fn(new, old, None, adv, w, extras=extras)
    step0 = (-torch.exp(torch.tensor(0.1)) + 0.5) / 2
    step1 = -1.0
    assert loss.item() == pytest.approx(((step0 + step1) / 4).item(), abs=1e-6)
    # dual clip: A < 0 with a huge ratio is capped at -A*c = 1.5
    new2 = old.clone()
    new2[0, 1, 1] = 5.0
    loss2, m2 = loss_fn(new2, old, None, adv, w, extras=extras)
    assert loss2.item() == pytest.approx(((-1 + 1.5) / 2 - 1.0) / 4, abs=1e-6)
    assert m2["pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_accumulate_equals_one_pass_and_per_sample_is_partition_invariant():
    w, roll = _block_fixture()
    roll = RolloutBatch(
        roll.prompt_ids.repeat(4, 1),
        roll.prompt_mask.repeat(4, 1),
        torch.randint(4, 60, (4, 12), generator=torch.Generator().manual_seed(5)),
        torch.ones(4, 12, dtype=torch.long),
        reveal_step=roll.reveal_step.repeat(4, 1),
        num_steps=9,
    )
    roll.response_mask[1, 9:] = 0
    roll.response_mask[2, 6:] = 0
    adv = torch.tensor([0.5, -1.0, 0.25, 1.5])
    comps = _components()
    rows = StepReplay().rows(w, roll, _context(4, adv))
    with torch.no_grad():
        old = comps.estimator(w, rows.batch, rows.corrupted) - torch.linspace(-0.3, 0.3, 12)

    def grads_of(partition, accumulate):
        w.module.zero_grad()
        total = 0.0
        for part in partition:
            idx = torch.tensor(part)
            b, c = rows.batch.select(idx), rows.corrupted.select(idx)
            scale = len(part) / 4
            args = (old[:, idx], None, adv[idx], rows.select_weights(idx))
            if accumulate:
                val, _ = comps.loss.accumulate(
                    lambda r: comps.estimator(w, b, _rows(c, r)),
                    c.num_samples,
                    *args,
                    scale,
                    extras=rows.select_extras(idx),
                )
            else:
                val, _ = comps.loss(comps.estimator(w, b, c), *args, extras=rows.select_extras(idx))
                (val * scale).backward()
            total += float(val.detach()) * scale
        return total, torch.cat([p.grad.flatten() for p in w.module.parameters() if p.grad is not None])

    one, g_one = grads_of([[0, 1, 2, 3]], False)
    acc, g_acc = grads_of([[0, 1, 2, 3]], True)
    split, g_split = grads_of([[0], [1, 2], [3]], True)
    assert one == pytest.approx(acc, abs=1e-6) and one == pytest.approx(split, abs=1e-6)
    assert g_one.abs().sum() > 0
    torch.testing.assert_close(g_acc, g_one, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g_split, g_one, rtol=1e-4, atol=1e-6)


def _rows(c, r):

    return c.select_samples(r)


def test_states_built_once_per_rollout_batch_and_shared_by_old_ref_new(tmp_path):
    log = spy_run(
        tmp_path,
        dare_plugin_cj_grpo,
        "cj_grpo",
        toy,
        ["rollout.gen_length=4", "rollout.block_length=4", "rollout.steps=4", "algorithm.kl_coef=0.1"],
    )
    assert_one_draw_per_batch(log, steps=2)


def test_block_model_trains_through_the_workflow(tmp_path):
    summary = tiny_rl_run(
        tmp_path,
        [toy_block, dare_plugin_cj_grpo, ProbePlugin()],
        "cj_grpo",
        "block_toy",
        ["rollout.gen_length=8", "rollout.steps=2", "rollout.truncate_at_eos=true"],
    )
    metrics = (tmp_path / "r" / "metrics.jsonl").read_text()
    assert '"replay_rows"' in metrics and summary["train"]["steps"] == 2
