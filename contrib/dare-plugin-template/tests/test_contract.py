"""The core's contract suite, run on this plugin, hand-computed checks of what it adds, and one
step of the core's RL loop.

``AlgorithmContract`` builds registries from the core's default plugins, ``plugins`` and what
their installed distributions require (installed entry points are not loaded), and checks on the
family-free toy model: a documented, frozen config; registered components; unknown options
rejected; one finite update that moves the parameters; the gradient independent of the
micro-batch and rank partition; the corruption reused bit-for-bit.
"""

import importlib
import math

import pytest
import torch

import dare_core.testing.toy as toy
import dare_plugin_myalgo
from dare_core.api import SequenceBatch, structure
from dare_core.testing.algorithm_checks import algorithm_components, one_rl_step
from dare_core.testing.contracts import AlgorithmContract
from dare_plugin_myalgo.algorithm import MyalgoConfig


class TestMyalgoContract(AlgorithmContract):
    algorithm = "myalgo"
    plugins = (dare_plugin_myalgo,)


@pytest.fixture
def components():
    """The algorithm's components as the RL loop gets them (the spec's names, the defaults)."""
    return algorithm_components((dare_plugin_myalgo,), "myalgo")


def test_corruption_masks_the_whole_response_only(components, toy_wrapper):
    ids = torch.tensor([[0, 0, 11, 12, 21, 22, 0], [10, 11, 12, 13, 21, 22, 23]])
    att = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    c = components.corruption(toy_wrapper, SequenceBatch(ids, att, 4), torch.Generator())
    m = toy_wrapper.mask_token_id
    assert c.noisy_ids.tolist() == [[[0, 0, 11, 12, m, m, 0], [10, 11, 12, 13, m, m, m]]]
    assert c.p_mask.tolist() == [[[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]]]


def test_loss_and_group_mean_advantage_by_hand(components):
    adv = components.advantage(torch.tensor([1.0, 0.0, 0.0, 3.0]), torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -1.5, 1.5]))
    logp = torch.tensor([[[-1.0, -3.0], [-2.0, -4.0]]], requires_grad=True)  # [M=1, B=2, R=2]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # 3 valid tokens
    loss, metrics = components.loss(logp, logp.detach(), None, torch.tensor([0.5, -0.5]), mask)
    # -(0.5*-1 + 0.5*-3 + -0.5*-2) / 3 = -(-0.5 - 1.5 + 1.0) / 3 = 1/3
    assert loss.item() == pytest.approx(1.0 / 3.0)
    assert metrics == {"logp_mean": pytest.approx(-2.0), "ratio_mean": pytest.approx(1.0)}
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[[-0.5, -0.5], [0.5, 0.0]]]) / 3)


def test_config_invariants():
    _, problems = structure(MyalgoConfig, {"adv_eps": 0.0, "loss_agg_mode": "sum"}, "algorithm")
    assert len(problems) == 2


def test_one_step_of_the_rl_loop_on_the_toy_family(tmp_path):
    """The core's RL loop runs the algorithm: a rollout of the toy family's reference sampler,
    rewards, this plugin's corruption and loss, one optimizer step that moves the weights."""
    samplers = importlib.import_module("dare_plugin_samplers")  # the test extra: the toy's rollout backend
    record = one_rl_step((dare_plugin_myalgo, toy, samplers), "myalgo", "toy", tmp_path)
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0
