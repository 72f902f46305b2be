"""The RL and SFT loops end to end on the family-free toy model, with test-only plugins.

These are the short learning tests of the core: a few optimizer steps must move held-out
accuracy in the right direction, the run directory must be complete, and the corruption must be
shared by the old and new log-probabilities of a batch.
"""

import json
import os

import pytest

import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core.config import resolve
from dare_core.plugins import build
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.train import train


@pytest.fixture
def dare():
    return build(
        load_entrypoints=False,
        extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, DigitsPlugin(rl_recipe={"trainer": {"lr": 3e-3}})],
    )


COMMON = [
    "task.name=digits",
    "task.num_eval=16",
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "rollout.steps=4",
    "eval.batch_size=16",
    "progress=false",
    "seed=3",
]


def test_rl_loop_learns_and_writes_run_dir(dare, tmp_path):
    cfg = resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=COMMON
        + [
            f"model.path={tmp_path / 'ckpt'}",
            f"output_dir={tmp_path}",
            "run_name=rl",
            "trainer.steps=25",
            "trainer.batch_size=8",
            "trainer.group_size=8",
            "trainer.micro_batch_size=32",
            "rollout.temperature=1.0",
            "trainer.save_every=10",
        ],
    )
    assert cfg.trainer.lr == 3e-3  # the algorithm recipe
    os.makedirs(tmp_path / "ckpt", exist_ok=True)
    summary = train(dare, cfg)
    before, after = summary["eval"]["before"], summary["eval"]["after"]
    assert after["reward"] > before["reward"] + 0.2, (before, after)
    root = tmp_path / "rl"
    for name in (
        "config.yaml",
        "plugins.json",
        "metrics.jsonl",
        "summary.json",
        "final/toy.pt",
        "checkpoints/step-10/toy.pt",
        "checkpoints/step-20/toy.pt",
        "eval_samples/before.json",
        "eval_samples/after.json",
    ):
        assert (root / name).exists(), name
    stored = json.loads((root / "summary.json").read_text())
    assert {"algo", "model", "task", "eval"} <= set(stored)
    assert stored["eval"]["after"]["accuracy"] == after["accuracy"]
    # the after-eval is compared item by item with the before-eval (same prompts, same sampler)
    pair = after["vs_before"]
    n = before["n"]
    assert pair["delta"] == pytest.approx(after["accuracy"] - before["accuracy"])
    assert pair["gained"] - pair["lost"] == round(n * (after["accuracy"] - before["accuracy"]))
    assert 0.0 <= pair["p_value"] <= 1.0 and "vs_before" not in before
    lines = [json.loads(l) for l in (root / "metrics.jsonl").read_text().splitlines()]
    steps = [l for l in lines if "reward" in l]
    assert len(steps) == 25 and all("pg_clipfrac" in l and "grad_norm" in l for l in steps)
    # reload the written config: same resolved values
    again = resolve(dare, config_file=str(root / "config.yaml"))
    assert again == cfg


def test_old_and_new_logprobs_share_the_corruption(dare, tmp_path, monkeypatch):
    """With one epoch and one mini-batch the first update's ratio is exactly 1 (here from a
    separate no-grad pass under the same corruption, not from the update's own forward)."""
    cfg = resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=COMMON
        + [
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=r1",
            "trainer.steps=1",
            "trainer.batch_size=2",
            "trainer.group_size=4",
            "eval.before=false",
            "eval.after=false",
            "trainer.reuse_logprob=false",
        ],
    )
    summary = train(dare, cfg)
    metrics = [json.loads(l) for l in (tmp_path / "r1" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics[0]["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert summary["eval"] == {}


def test_reused_logprobs_train_the_same_weights(dare, tmp_path):
    """``trainer.reuse_logprob`` skips the separate old-log-likelihood pass when each batch gets
    one optimizer step; the run must end with the same weights and metrics as without it."""
    import torch

    runs = {}
    for reuse in (False, True):
        cfg = resolve(
            dare,
            algo="pg_test",
            model="toy",
            overrides=COMMON
            + [
                f"model.path={tmp_path}",
                f"output_dir={tmp_path}",
                f"run_name=reuse-{reuse}",
                "trainer.steps=3",
                "trainer.batch_size=4",
                "trainer.group_size=4",
                "rollout.temperature=1.0",
                "trainer.micro_batch_size=8",
                "eval.before=false",
                "eval.after=false",
                f"trainer.reuse_logprob={reuse}",
            ],
        )
        train(dare, cfg)
        root = tmp_path / f"reuse-{reuse}"
        runs[reuse] = (
            torch.load(root / "final" / "toy.pt"),
            [json.loads(l) for l in (root / "metrics.jsonl").read_text().splitlines()],
        )
    (w_sep, m_sep), (w_reuse, m_reuse) = runs[False], runs[True]
    assert w_sep.keys() == w_reuse.keys()
    for k in w_sep:
        torch.testing.assert_close(w_reuse[k], w_sep[k], rtol=1e-5, atol=1e-6)
    for a, b in zip(m_sep, m_reuse):
        assert a["reward"] == b["reward"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert b["ratio_mean"] == 1.0
    assert any(abs(a["grad_norm"]) > 0 for a in m_sep)


@pytest.mark.parametrize("reward", ["score", "acc"])
def test_task_reward_chooses_partial_credit_or_exact(dare, tmp_path, reward):
    """``task.reward=acc`` trains on exact correctness (0/1) instead of the task's partial
    credit; the logged reward is then the rollouts' accuracy."""
    cfg = resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=COMMON
        + [
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            f"run_name={reward}",
            "trainer.steps=3",
            "trainer.batch_size=4",
            "trainer.group_size=4",
            "rollout.temperature=1.0",
            "eval.before=false",
            "eval.after=false",
            f"task.reward={reward}",
        ],
    )
    train(dare, cfg)
    steps = [json.loads(l) for l in (tmp_path / reward / "metrics.jsonl").read_text().splitlines()]
    partial = False
    for rec in steps:
        if reward == "acc":
            assert rec["reward"] == pytest.approx(rec["accuracy"])
        partial |= rec["reward"] != pytest.approx(rec["accuracy"])
    assert partial == (reward == "score")  # the digits task gives partial credit


def test_task_reward_rejects_unknown_values(dare):
    from dare_core.errors import ConfigError

    with pytest.raises(ConfigError, match="task.reward"):
        resolve(dare, algo="pg_test", model="toy", overrides=COMMON + ["model.path=x", "task.reward=cells"])


def test_sft_loop_lowers_loss(dare, tmp_path):
    cfg = resolve(
        dare,
        algo="sup_test",
        model="toy",
        overrides=COMMON
        + [
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=sft",
            "trainer.steps=60",
            "trainer.lr=1e-2",
            "trainer.batch_size=16",
            "trainer.micro_batch_size=8",
        ],
    )
    summary = train(dare, cfg)
    lines = [json.loads(l) for l in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    losses = [l["loss"] for l in lines if "loss" in l]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:5]) / 5
    assert summary["eval"]["after"]["reward"] > summary["eval"]["before"]["reward"]


def test_final_export_is_atomic(tmp_path, monkeypatch):
    """A failure while exporting leaves the previous final checkpoint in place and no temp
    directory behind."""
    import types

    from dare_core.config import RunConfig
    from dare_core.config.schema import ModelConfig
    from dare_core.engines import SingleProcessEngine
    from dare_core.rundir import RunDir
    from dare_core.workflows.checkpoint import save_final

    config = RunConfig(model=ModelConfig(path=str(tmp_path / "ckpt"), device="cpu"))
    w = toy.make_toy_wrapper()
    ctx = types.SimpleNamespace(
        rundir=RunDir(str(tmp_path / "run")), engine=SingleProcessEngine(config), wrapper=w, config=config
    )
    save_final(ctx)
    before = (tmp_path / "run" / "final" / "toy.pt").read_bytes()

    def broken(path, state_dict=None):
        open(os.path.join(path, "partial"), "w").write("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(w, "save_pretrained", broken)
    with pytest.raises(RuntimeError):
        save_final(ctx)
    assert (tmp_path / "run" / "final" / "toy.pt").read_bytes() == before
    assert not (tmp_path / "run" / "final" / "partial").exists()
    assert [p for p in os.listdir(tmp_path / "run") if p.startswith(".tmp")] == []


def test_training_rollout_applies_the_algorithm_adjustments(tmp_path):
    """The loop and the probe script roll out with ``training_rollout``: the training backend, built
    once on ``RunConfig.train_rollout`` (``RolloutNeeds.adjust`` applied by config resolution),
    with ``RolloutNeeds.wrap`` around it; evaluation keeps the run's settings."""
    import attrs

    from dare_core.interfaces import AlgorithmSpec, RolloutNeeds
    from dare_core.plugins import hookimpl
    from dare_core.testing.digits import ClipConfig, pg_components
    from dare_core.workflows.rl import training_rollout
    from dare_core.workflows.runtime import setup

    class Wrapped:
        def __init__(self, inner, run_config):
            self.inner, self.run_config = inner, run_config

    needs = RolloutNeeds(
        fields=frozenset({"temperature"}), adjust=lambda cfg, rc: attrs.evolve(rc, temperature=0.25), wrap=Wrapped
    )

    class Adjusted:
        @hookimpl
        def dare_register_algorithms(self, register):
            register(AlgorithmSpec("adjusted_test", "rl", ClipConfig, pg_components, rollout=needs))

    dare = build(
        load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, DigitsPlugin(), Adjusted()]
    )
    cfg = resolve(
        dare,
        algo="adjusted_test",
        model="toy",
        overrides=COMMON + [f"model.path={tmp_path}", "rollout.temperature=1.0"],
    )
    ctx = setup(dare, cfg)
    backend = training_rollout(ctx)
    assert isinstance(backend, Wrapped) and backend.run_config is cfg
    assert backend.inner is ctx.rollout and ctx.rollout.config.temperature == 0.25
    assert cfg.rollout.temperature == 1.0 and cfg.train_rollout.temperature == 0.25  # the run's own is kept
    assert ctx.eval_rollout.config.temperature == cfg.eval.temperature
    plain = setup(
        build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, DigitsPlugin()]),
        resolve(dare, algo="pg_test", model="toy", overrides=COMMON + [f"model.path={tmp_path}"]),
    )
    assert training_rollout(plain) is plain.rollout


def test_a_backend_without_the_declared_rollout_fields_is_refused_in_one_line(tmp_path):
    """An algorithm whose spec declares rollout config fields (``RolloutNeeds.fields``) no backend of the
    family offers is refused before the first rollout, in one line naming the field."""
    from dare_core.errors import DareError
    from dare_core.interfaces import AlgorithmSpec, RolloutNeeds
    from dare_core.plugins import hookimpl
    from dare_core.testing.digits import ClipConfig, pg_components

    class NeedsField:
        @hookimpl
        def dare_register_algorithms(self, register):
            register(
                AlgorithmSpec(
                    "needs_field_test",
                    "rl",
                    ClipConfig,
                    pg_components,
                    rollout=RolloutNeeds(fields=frozenset({"no_such_field"})),
                )
            )

    dare = build(
        load_entrypoints=False,
        extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, DigitsPlugin(), NeedsField()],
    )
    cfg = resolve(
        dare,
        algo="needs_field_test",
        model="toy",
        overrides=COMMON + [f"model.path={tmp_path}", f"output_dir={tmp_path}", "trainer.steps=1", "eval.before=false"],
    )
    with pytest.raises(DareError) as info:
        train(dare, cfg)
    message = str(info.value)
    assert "\n" not in message and "no_such_field" in message and "needs_field_test" in message


def test_micro_batches_sum_to_the_whole_batch_gradient(dare, tmp_path):
    """The update accumulates a mini-batch's gradient in micro-batches (each normalised by the
    mini-batch's totals): the sum must be the gradient of one pass over every row, so that a
    probe of a many-row algorithm (one row per trained step) fits in memory and still measures
    the loop's gradient."""
    import torch

    from dare_core.interfaces import RLComponents
    from dare_core.workflows.rl import PolicyObjective, collect, rows_update_batch, training_rollout
    from dare_core.workflows.runtime import setup
    from dare_core.workflows.update import UpdatePlan, backward_minibatch

    cfg = resolve(
        dare, algo="pg_test", model="toy", overrides=COMMON + [f"model.path={tmp_path}", "rollout.temperature=1.0"]
    )
    ctx = setup(dare, cfg)
    comps = ctx.bundle(RLComponents)
    c = collect(
        ctx,
        training_rollout(ctx),
        comps.trajectory,
        comps.advantage,
        ctx.task.examples("train", limit=4, seed=0)[:4],
        4,
        1,
    )
    total = c.rows.batch.batch_size
    assert total == 16 and c.rows.advantages.abs().sum() > 0
    grads = {}
    for micro in (total, 3):
        ctx.wrapper.module.zero_grad()
        _, metrics = backward_minibatch(
            None,
            PolicyObjective(comps, ctx.wrapper),
            rows_update_batch(c.rows, c.corrupted),
            UpdatePlan(micro_batch=micro),
        )
        assert "pg_clipfrac" in metrics
        grads[micro] = [p.grad.clone() for p in ctx.wrapper.module.parameters() if p.grad is not None]
    assert grads[total] and any(g.abs().sum() > 0 for g in grads[total])
    for whole, parts in zip(grads[total], grads[3]):
        torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-7)


def test_results_on_stdout_logs_on_stderr_and_quiet(dare, dare_cli, tmp_path, monkeypatch):
    """``dare train`` prints its result line on stdout and its log lines (evaluations, metric
    lines, the run directory) on stderr; ``dare --quiet`` drops the log lines, not the result."""
    invoke = dare_cli(dare)
    args = ["train", "--algo", "pg_test", "--model", "toy", *COMMON, f"model.path={tmp_path}", "trainer.steps=2"]
    loud = invoke(*args, f"output_dir={tmp_path / 'a'}")
    assert loud.exit_code == 0, loud.output
    assert loud.stdout.startswith(f"done: {tmp_path / 'a'}") and loud.stdout.count("\n") == 1
    assert "eval before" in loud.stderr
    monkeypatch.setenv("DARE_QUIET", "0")  # restored after the test: --quiet sets it in this process
    hushed = invoke("--quiet", *args, f"output_dir={tmp_path / 'b'}")
    assert hushed.exit_code == 0, hushed.output
    assert hushed.stdout.startswith(f"done: {tmp_path / 'b'}") and hushed.stderr == ""
