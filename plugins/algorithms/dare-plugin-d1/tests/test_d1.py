"""d1 (arXiv:2504.12216): corruption oracle, hand-computed loss values, estimator, contract."""

import math

import pytest
import torch

import dare_plugin_d1
from dare_core.components import ComponentLookup
from dare_core.interfaces import SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.registries import build_for
from dare_plugin_d1.algorithm import D1Config, D1Masking
from dare_plugin_d1.algorithm import build as build_d1


class TestD1Contract(AlgorithmContract):
    algorithm = "d1"
    plugins = (dare_plugin_d1,)


def _components(**cfg):
    dare = build_for(dare_plugin_d1)
    spec = dare.registries.algorithms.get("d1")
    return build_d1(D1Config(**cfg), ComponentLookup(dare.registries, components=spec.components))


def test_masking_oracle_prompt_rate_response_all_padding_none():
    w = make_toy_wrapper()
    B, P, R = 4000, 8, 4
    ids = torch.randint(10, 40, (B, P + R))
    att = torch.ones(B, P + R, dtype=torch.long)
    att[:, :3] = 0
    ids[:, :3] = w.pad_token_id
    batch = SequenceBatch(ids, att, P)
    c = D1Masking(0.15, 1)(w, batch, torch.Generator().manual_seed(0))
    assert not c.masked[0, :, :3].any()
    assert c.masked[0, :, P:].all()
    rate = c.masked[0, :, 3:P].float().mean().item()
    assert abs(rate - 0.15) < 0.01
    assert (c.p_mask[0, :, :3] == 0).all()
    assert torch.allclose(c.p_mask[0, :, 3:P], torch.tensor(0.15))
    assert (c.p_mask[0, :, P:] == 1).all()
    assert (c.noisy_ids[c.masked] == w.mask_token_id).all()


def test_loss_hand_computed_clip_and_dual_clip():
    comps = _components()
    mask = torch.ones(1, 1)
    old = torch.tensor([[[-1.2]]])
    new = torch.tensor([[[-1.0]]])
    # A > 0: r = e^0.2 = 1.2214 > 1.2 -> clipped: -A * 1.2
    loss, m = comps.loss(new, old, None, torch.tensor([1.0]), mask)
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert m["pg_clipfrac"] == 1.0
    # A < 0: max(1.2214, 1.2) = 1.2214 < 3 -> unclipped
    loss, m = comps.loss(new, old, None, torch.tensor([-1.0]), mask)
    assert loss.item() == pytest.approx(math.exp(0.2), abs=1e-6)
    # A < 0 with a huge ratio: dual clip caps at -A * c = 3
    loss, m = comps.loss(torch.tensor([[[1.0]]]), old, None, torch.tensor([-1.0]), mask)
    assert loss.item() == pytest.approx(3.0, abs=1e-6)
    assert m["pg_clipfrac_lower"] == 1.0


def test_kl_term_needs_reference_and_adds_penalty():
    comps = _components(kl_coef=0.5, kl_type="dare_log1p_k1")  # the DARE reference's rule
    assert comps.needs_ref
    lp = torch.tensor([[[-1.0, -1.0]]])
    loss0, _ = _components().loss(lp, lp, None, torch.tensor([-1.0]), torch.ones(1, 2))
    ref = torch.tensor([[[-1.5, -0.5]]])
    loss, m = comps.loss(lp, lp, ref, torch.tensor([-1.0]), torch.ones(1, 2))
    # A < 0 -> k = d = [0.5, -0.5], token-mean 0
    assert loss.item() == pytest.approx(loss0.item() + 0.5 * 0.0, abs=1e-6)
    loss, m = comps.loss(lp, lp, ref, torch.tensor([1.0]), torch.ones(1, 2))
    k = (math.log(1.5) + math.log(0.5)) / 2
    assert m["kl_loss"] == pytest.approx(k, abs=1e-6)
    # the default estimator is the paper's k3 = e^{-d} + d - 1 on d = ℓ - ℓ_ref (β = 0.04 in d1)
    _, m = _components(kl_coef=0.04).loss(lp, lp, ref, torch.tensor([1.0]), torch.ones(1, 2))
    assert m["kl_loss"] == pytest.approx((math.exp(-0.5) - 0.5 + math.exp(0.5) + 0.5 - 2) / 2, abs=1e-6)
    with pytest.raises(ValueError):
        comps.loss(lp, lp, None, torch.tensor([1.0]), torch.ones(1, 2))


def test_estimator_is_one_step_mean_field_and_ratio_one_first_update():
    comps = _components()
    w = make_toy_wrapper()
    ids = torch.randint(10, 40, (3, 9))
    batch = SequenceBatch(ids, torch.ones_like(ids), 5)
    c = comps.corruption(w, batch, torch.Generator().manual_seed(0))
    assert (c.noisy_ids[0, :, 5:] == w.mask_token_id).all()
    logp = comps.estimator(w, batch, c)
    ref = torch.log_softmax(w.logits(c.noisy_ids[0]).float(), -1).gather(-1, ids[..., None])[..., 0][:, 5:]
    torch.testing.assert_close(logp[0], ref)
    with torch.no_grad():
        old = comps.estimator(w, batch, c)
    adv = torch.tensor([1.0, -0.5, 0.25])
    loss, m = comps.loss(logp, old, None, adv, torch.ones(3, 4))
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert m["ratio_mean"] == pytest.approx(1.0)


def test_config_invariants_are_validators():
    from dare_core.config.structure import structure

    _, problems = structure(D1Config, {"p_mask_prompt": 1.5, "clip_ratio_c": 0.5, "mc_num": 0}, "algorithm")
    assert len(problems) == 3


def test_defaults_are_the_papers():
    cfg = D1Config()
    assert cfg.remask_each_update and cfg.truncate_at_eos and cfg.kl_type == "k3"
    comps = _components()
    assert comps.remask_each_epoch
    from dare_plugin_d1.config import eos_truncation
    from dare_plugin_samplers.config import LowConfidenceConfig

    assert eos_truncation(cfg, LowConfidenceConfig()).truncate_at_eos
    assert not eos_truncation(
        D1Config(truncate_at_eos=False), LowConfidenceConfig(truncate_at_eos=True)
    ).truncate_at_eos
    assert not _components(remask_each_update=False).remask_each_epoch


def test_completion_ends_at_first_eos_rewards_read_the_truncated_text():
    from dare_core.api import RolloutBatch, TrajectoryContext, decode_responses
    from dare_plugin_samplers.low_confidence import mask_through_first_stop

    w = make_toy_wrapper()
    eos, a, b = w.eos_token_id, 20, 21
    response = torch.tensor([[a, eos, b, b], [a, a, a, b]])
    mask = mask_through_first_stop(response, [eos], True)  # the sampler under truncate_at_eos
    roll = RolloutBatch(torch.full((2, 3), 12), torch.ones(2, 3, dtype=torch.long), response, mask)
    texts = decode_responses(w, response, mask)
    assert texts[0] == decode_responses(w, response[:1, :2], torch.ones(1, 2))[0]
    assert texts[1] == decode_responses(w, response[1:], torch.ones(1, 4))[0] != texts[0]
    ctx = TrajectoryContext(torch.tensor([1.0, 0.0]), torch.tensor([0.5, -0.5]), torch.tensor([0, 0]), None)
    rows = _components().trajectory.rows(w, roll, ctx)
    # the forward sees the whole completion (all of it masked by d1_masking), the loss its first
    # EOS-terminated part only (d1's completion_mask)
    assert rows.batch.attention_mask.tolist() == [[1] * 7, [1] * 7]
    assert rows.loss_weights().tolist() == [[1.0, 1.0, 0.0, 0.0], [1.0] * 4]
    c = _components().corruption(w, rows.batch, torch.Generator().manual_seed(0))
    assert c.masked[0, :, 3:].all()


@pytest.mark.parametrize("remask", [True, False])
def test_prompt_masking_redrawn_for_each_inner_update(tmp_path, remask):
    """d1's regulariser: a new prompt masking per inner update (PPO epoch), its old/new
    log-probabilities under that masking; one masking per batch with remask_each_update=false."""
    from dare_core.testing import toy
    from dare_core.testing.rl_probe import assert_one_draw_per_batch, spy_run

    log = spy_run(
        tmp_path,
        dare_plugin_d1,
        "d1",
        toy,
        [
            "rollout.gen_length=4",
            "rollout.block_length=4",
            "rollout.steps=4",
            "trainer.ppo_epochs=2",
            f"algorithm.remask_each_update={str(remask).lower()}",
        ],
    )
    if not remask:
        assert_one_draw_per_batch(log, steps=2)
        return
    draws = log.draws
    assert len(draws) == 4 and all(draws[2 * s] != draws[2 * s + 1] for s in (0, 1))
    for s in (0, 1):  # events of step s: two draws, old log-probs of both, then epoch 0 and 1 updates
        start = log.events.index(("draw", draws[2 * s]))
        stop = log.events.index(("draw", draws[2 * s + 2])) if s == 0 else len(log.events)
        est = [e for e in log.events[start:stop] if e[0] == "estimate"]
        grad = [rows for _, g, rows in est if g]
        half = len(grad) // 2
        assert half and all(r <= draws[2 * s] for r in grad[:half])
        assert all(r <= draws[2 * s + 1] for r in grad[half:])
        nograd = [rows for _, g, rows in est if not g]
        assert any(r <= draws[2 * s] for r in nograd) and any(r <= draws[2 * s + 1] for r in nograd)
