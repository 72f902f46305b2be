"""``solved_group_frac`` compares a group's rewards with the task's maximum reward
(``TaskSpec.max_score``, 1 under ``task.reward=acc``), not with the batch's best."""

from types import SimpleNamespace

import attrs
import pytest
import torch

import dare_plugin_tasks
from dare_core.config import RunConfig
from dare_core.testing.registries import build_for
from dare_core.testing.rl_probe import ProbePlugin
from dare_core.workflows.rl import _group_stats

IDS = torch.tensor([0, 0, 1, 1, 2, 2])


def _ctx(dare, task: str, reward: str = "score"):
    cfg = RunConfig()
    return SimpleNamespace(dare=dare, config=attrs.evolve(cfg, task=attrs.evolve(cfg.task, name=task, reward=reward)))


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_tasks, ProbePlugin())


def test_bundled_tasks_declare_their_maximum_reward(dare):
    for name in [
        "sudoku",
        "countdown",
        "gsm8k",
        "math500",
        "aime2024",
        "aime2025",
        "humaneval",
        "humaneval_plus",
        "mbpp",
        "multiple_choice",
        "parquet",
    ]:
        assert dare.registries.tasks.get(name).max_score == 1.0, name


def test_solved_means_every_rollout_reaches_the_task_maximum(dare):
    # countdown's format-only credit is 0.1: a batch whose best is 0.1 has no solved group
    partial = torch.tensor([0.1, 0.1, 0.0, 0.1, 0.0, 0.0])
    stats = _group_stats(_ctx(dare, "countdown"), partial, IDS)
    assert stats == {"solved_group_frac": 0.0, "flat_group_frac": pytest.approx(2 / 3)}
    stats = _group_stats(_ctx(dare, "countdown"), torch.tensor([1.0, 1.0, 1.0, 0.1, 0.0, 0.0]), IDS)
    assert stats == {"solved_group_frac": pytest.approx(1 / 3), "flat_group_frac": pytest.approx(2 / 3)}


def test_acc_reward_is_solved_at_one_and_an_unknown_maximum_is_not_reported(dare):
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert _group_stats(_ctx(dare, "parity", "acc"), rewards, IDS)["solved_group_frac"] == pytest.approx(1 / 3)
    assert dare.registries.tasks.get("parity").max_score is None
    assert _group_stats(_ctx(dare, "parity"), rewards, IDS) == {"flat_group_frac": pytest.approx(2 / 3)}
