"""JustGRPO: exact left-to-right log-probabilities (= the sampler's own probabilities), the
autoregressive replay states, the forced training rollout, token-mean loss, contract, states
built once per rollout batch."""

import math

import pytest
import torch

import dare_plugin_justgrpo
from dare_core.config.structure import structure
from dare_core.errors import CapabilityError, DareError
from dare_core.interfaces.rows import TrajectoryContext
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.contracts import AlgorithmContract
from dare_core.testing.registries import build_for
from dare_core.testing.rl_probe import assert_one_draw_per_batch, components_of, spy_run
from dare_nn.testing import toy_block
from dare_plugin_justgrpo.algorithm import JustConfig
from dare_plugin_justgrpo.config import left_to_right
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler


class TestJustContract(AlgorithmContract):
    algorithm = "justgrpo"
    plugins = (dare_plugin_justgrpo,)


def _components(**cfg):
    return components_of(dare_plugin_justgrpo, "justgrpo", **cfg)


def _rollout(comps, w, temperature=1.0, R=6, record=frozenset({"reveal_step", "step_states"})):
    just = JustConfig(temperature=comps.estimator.temperature)
    cfg = left_to_right(just, LowConfidenceConfig(gen_length=R, block_length=R, steps=2, temperature=temperature))
    prompts = torch.randint(4, 60, (3, 4), generator=torch.Generator().manual_seed(0))
    pmask = torch.ones_like(prompts)
    pmask[1, :1] = 0
    roll = LowConfidenceSampler(cfg).generate(
        w, prompts, pmask, record=record, generator=torch.Generator().manual_seed(1)
    )
    ctx = TrajectoryContext(torch.zeros(3), torch.tensor([1.0, -1.0, 0.5]), torch.arange(3), lambda *a: torch.zeros(3))
    return cfg, roll, comps.trajectory.rows(w, roll, ctx)


def test_training_rollout_is_forced_left_to_right_at_the_algorithm_temperature():
    cfg = left_to_right(JustConfig(temperature=0.7), LowConfidenceConfig(gen_length=40, block_length=40, steps=20))
    assert (cfg.block_length, cfg.steps, cfg.temperature) == (1, 40, 0.7)
    follow = left_to_right(
        JustConfig(temperature=None), LowConfidenceConfig(gen_length=8, block_length=8, temperature=0.9)
    )
    assert follow.temperature == 0.9
    with pytest.raises(DareError, match="temperature > 0"):
        left_to_right(JustConfig(temperature=None), LowConfidenceConfig(gen_length=8, block_length=8, temperature=0.0))


def test_the_learner_uses_the_training_rollouts_temperature(tmp_path):
    """A run whose algorithm temperature is null trains at the rollout's: the estimator is built
    on ``RunConfig.train_rollout``."""
    from dare_core.config import resolve
    from dare_core.testing.digits import DigitsPlugin
    from dare_core.workflows.runtime import setup

    dare = build_for(toy, DigitsPlugin(), dare_plugin_justgrpo)
    over = [
        "task.name=digits",
        "rollout.backend=low_confidence",
        "rollout.gen_length=6",
        "rollout.block_length=3",
        "rollout.temperature=0.9",
    ]
    cfg = resolve(
        dare, algo="justgrpo", model="toy", overrides=over + ["algorithm.temperature=null", f"model.path={tmp_path}"]
    )
    assert (cfg.train_rollout.block_length, cfg.train_rollout.steps, cfg.train_rollout.temperature) == (1, 6, 0.9)
    assert cfg.eval_rollout.block_length == 3  # evaluation keeps the run's
    assert setup(dare, cfg).components.estimator.temperature == 0.9


def test_ar_states_and_exact_sampling_logprobs():
    """At T = 1 the learner's ℓ_t is the log of the probability with which the sampler drew y_t."""
    comps = _components(temperature=1.0)
    w = make_toy_wrapper()
    _, roll, rows = _rollout(comps, w)
    R = 6
    assert torch.equal(roll.reveal_step, torch.arange(R).expand(3, R))
    P = rows.batch.prompt_len
    assert rows.corrupted.num_samples == R
    for t in range(R):
        resp = rows.corrupted.noisy_ids[t, :, P:]
        assert torch.equal(resp[:, :t], roll.response_ids[:, :t])
        assert (resp[:, t:] == w.mask_token_id).all()
        assert rows.corrupted.masked[t, :, P:].sum(-1).tolist() == [1, 1, 1]
    with torch.no_grad():
        lp = comps.estimator(w, rows.batch, rows.corrupted)
    conf = roll.extras["step_confidence"].transpose(0, 1)  # [R, B, R]
    diag = torch.arange(R)
    torch.testing.assert_close(lp[diag, :, diag], conf[diag, :, diag].float().log(), rtol=1e-4, atol=1e-5)


def test_temperature_divides_the_logits():
    comps = _components(temperature=0.5, exclude_mask_token=False)
    w = make_toy_wrapper()
    _, roll, rows = _rollout(comps, w, temperature=0.5)
    with torch.no_grad():
        lp = comps.estimator(w, rows.batch, rows.corrupted)
        logits = w.logits(rows.corrupted.noisy_ids[2], rows.batch.attention_mask).float()
    P = rows.batch.prompt_len
    expect = torch.log_softmax(logits / 0.5, -1)[:, P + 2].gather(-1, roll.response_ids[:, 2:3])[:, 0]
    torch.testing.assert_close(lp[2, :, 2], expect, rtol=1e-5, atol=1e-6)


def test_token_mean_loss_hand_computed():
    comps = _components()
    old = torch.zeros(2, 2, 2)
    new = old.clone()
    new[0, 0, 0] = math.log(1.5)  # A = 1: clipped at 1.2
    new[1, 1, 1] = math.log(0.5)  # A = -2: max(1.0, 1.6) = 1.6
    w = torch.tensor([[[1.0, 0], [0, 0]], [[0, 1], [0, 1]]])
    extras = {"replay_reduction": torch.tensor([2, 2]), "replay_steps": torch.tensor([2, 2])}
    loss, m = comps.loss(new, old, None, torch.tensor([1.0, -2.0]), w, extras=extras)
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 1.6) / 3, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)


def test_block_models_refused_in_one_line():
    from dare_core.config.loader import check_support

    dare = build_for(toy_block, dare_plugin_justgrpo)
    with pytest.raises(CapabilityError) as err:
        check_support(dare, "justgrpo", "block_toy")
    assert "\n" not in str(err.value) and "masked" in str(err.value)


def test_config_invariants_are_validators():
    _, problems = structure(JustConfig, {"temperature": 0.0, "row_chunk": 0}, "algorithm")
    assert len(problems) == 2


def test_states_built_once_per_rollout_batch_and_shared_by_old_ref_new(tmp_path):
    log = spy_run(
        tmp_path,
        dare_plugin_justgrpo,
        "justgrpo",
        toy,
        ["rollout.gen_length=4", "rollout.block_length=4", "rollout.steps=2", "algorithm.kl_coef=0.1"],
    )
    assert_one_draw_per_batch(log, steps=2)


def test_judged_by_training_rollout_is_left_to_right_at_the_algorithm_temperature(tmp_path):
    """`dare compare --training-sampler`: the evaluation sampler is the forced training one."""
    from dare_core.config import resolve
    from dare_core.testing.digits import DigitsPlugin
    from dare_plugin_report.compare import judged_by_training_rollout

    dare = build_for(toy, DigitsPlugin(), dare_plugin_justgrpo)
    cfg = resolve(
        dare,
        algo="justgrpo",
        model="toy",
        overrides=[
            "task.name=digits",
            "rollout.backend=low_confidence",
            "rollout.gen_length=6",
            "rollout.block_length=6",
            "rollout.steps=3",
            "rollout.temperature=1.0",
            "algorithm.temperature=0.7",
            "eval.temperature=0.0",
            "progress=false",
            f"model.path={tmp_path}",
        ],
    )
    ev = judged_by_training_rollout(dare, cfg).eval_rollout
    assert (ev.block_length, ev.steps, ev.temperature) == (1, 6, 0.7)
    assert cfg.eval_rollout.block_length == 6  # the run's own evaluation is unchanged
