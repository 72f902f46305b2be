"""Hand-computed values for the estimator, the loss and the composed advantage; config and run
invariants."""

import attrs
import pytest
import torch

import dare_plugin_reinforce_rloo
from dare_core.api import (
    ComponentLookup,
    ConfigError,
    Corrupted,
    DareError,
    SequenceBatch,
    resolve,
    structure,
)
from dare_core.testing import fake_rollout, toy
from dare_plugin_reinforce_rloo.algorithm import (
    MaskedMeanSequenceLogProb,
    ReinforceRLOOConfig,
    SequenceReinforceLoss,
    build,
)


def toy_build():
    """Registries from the core defaults, the test-only toy family and this plugin only."""
    from dare_core.testing.registries import build_for

    return build_for(toy, dare_plugin_reinforce_rloo)


def declared_lookup():
    """The lookup a run gives ``build``: this plugin's registries and its spec's components."""
    registries = toy_build().registries
    return ComponentLookup(registries, components=registries.algorithms.get("reinforce_rloo").components)


class TableWrapper:
    """Stands in for a model: the m-th ``token_logprobs`` call returns ``tables[m]`` ([B, S])."""

    mask_token_id = 99

    def __init__(self, tables):
        self.tables = tables
        self.calls = 0

    def token_logprobs(self, noisy_ids, targets, attention_mask=None, clean_ids=None, prompt_len=None):
        out = self.tables[self.calls]
        self.calls += 1
        return out


def test_estimator_hand_computed():
    # B = 3 sequences, P = 1 prompt column, R = 3 response columns, M = 2 corruption rows.
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    att = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])  # b=2: last response token is padding
    batch = SequenceBatch(ids, att, 1)
    tables = torch.tensor(
        [
            [[-9.0, -1.0, -2.0, -3.0], [-9.0, -4.0, -5.0, -6.0], [-100.0, -100.0, -100.0, -100.0]],
            [[-9.0, -0.5, -1.5, -2.5], [-9.0, -7.0, -8.0, -9.5], [-100.0, -100.0, -100.0, -100.0]],
        ]
    )
    T, F = True, False
    masked = torch.tensor(
        [
            [[F, T, F, T], [T, F, F, F], [F, F, F, T]],  # b=1: only a prompt column (ignored); b=2: padding (ignored)
            [[F, F, T, F], [F, T, F, F], [F, F, F, F]],
        ]
    )
    corrupted = Corrupted(torch.where(masked, 99, ids[None]), masked, masked.float())
    w = TableWrapper(tables)
    ell = MaskedMeanSequenceLogProb()(w, batch, corrupted)
    assert w.calls == 2 and ell.shape == (1, 3)
    # b=0: (-1 - 3 - 1.5) / 3;  b=1: -7 / 1;  b=2: nothing masked -> 0
    torch.testing.assert_close(ell, torch.tensor([[-5.5 / 3.0, -7.0, 0.0]]))


def test_estimator_on_toy_model_matches_direct_computation(toy_wrapper):
    roll = fake_rollout(toy_wrapper)
    batch = roll.sequences()
    comps = build(ReinforceRLOOConfig(mc_num=3), declared_lookup())
    c = comps.corruption(toy_wrapper, batch, torch.Generator().manual_seed(0))
    assert c.noisy_ids.shape[0] == 3
    ell = comps.estimator(toy_wrapper, batch, c)
    P = batch.prompt_len
    num = torch.zeros(batch.batch_size)
    den = torch.zeros(batch.batch_size)
    for m in range(3):
        lp = torch.log_softmax(toy_wrapper.logits(c.noisy_ids[m], batch.attention_mask), -1)
        lp = lp.gather(-1, batch.input_ids[..., None])[..., 0][:, P:]
        hit = c.masked[m, :, P:].float()
        num += (lp * hit).sum(1)
        den += hit.sum(1)
    assert (den > 0).all()
    torch.testing.assert_close(ell, (num / den)[None], rtol=1e-5, atol=1e-5)


def test_loss_hand_computed_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)  # [M'=1, B=2]
    old = torch.tensor([[-1.0, -2.5]])
    adv = torch.tensor([0.5, -1.0])
    loss, metrics = SequenceReinforceLoss()(logp, old, None, adv, torch.ones(2, 3))
    # -(0.5 * -1 + -1 * -2) / 2 = -(-0.5 + 2) / 2 = -0.75
    assert loss.item() == pytest.approx(-0.75)
    assert metrics["logp_mean"] == pytest.approx(-1.5)
    assert metrics["ratio_mean"] == pytest.approx((1.0 + torch.exp(torch.tensor(0.5)).item()) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 0.5]]))  # -A_b / B
    with pytest.raises(ValueError, match="per-sequence"):
        SequenceReinforceLoss()(torch.zeros(1, 2, 3), None, None, adv, torch.ones(2, 3))


def test_composed_advantage_is_leave_one_out():
    comps = build(ReinforceRLOOConfig(), declared_lookup())
    adv = comps.advantage(torch.tensor([1.0, 0.0, 0.0, 2.0]), torch.tensor([0, 0, 0, 1]))
    # group 0: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5 (twice); singleton group 1 -> its reward (baseline 0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5, 2.0]))


def test_config_invariants_are_validators():
    _, problems = structure(ReinforceRLOOConfig, {"mc_num": 0, "eps": 1.0}, "algorithm")
    assert len(problems) == 2


def test_group_size_one_is_refused_when_the_run_is_configured(tmp_path):
    dare = toy_build()
    family = dare.registries.models.names()[0]  # the only family registered: dare_core's toy
    kw = dict(algo="reinforce_rloo", model=family)
    ok = resolve(dare, overrides=[f"model.path={tmp_path}"], **kw)
    assert ok.trainer.group_size == 4 and ok.trainer.ppo_epochs == 1  # the recipe
    dare.pm.hook.dare_configure.call_historic(kwargs={"config": ok})
    with pytest.raises(ConfigError, match="trainer.group_size=1"):  # the core: rloo needs groups
        resolve(dare, overrides=[f"model.path={tmp_path}", "trainer.group_size=1"], **kw)
    bad = attrs.evolve(ok, trainer=attrs.evolve(ok.trainer, group_size=1))  # built around resolve
    with pytest.raises(DareError, match="group_size >= 2"):
        dare_plugin_reinforce_rloo.dare_configure(config=bad)
    with pytest.raises(ConfigError, match="mc_num"):
        resolve(dare, overrides=[f"model.path={tmp_path}", "algorithm.mc_num=0"], **kw)
