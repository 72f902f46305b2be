"""Divergence on the toy model: a non-finite loss or gradient norm is reported in its step, N such
steps in a row stop the run (one ``error:`` line and status 2 from the CLI) before any
after-evaluation or ``final/``; ``metrics.jsonl`` stays strict JSON; weights that are not finite
are never written; the RL console line shows what moves; evaluation shows a progress bar on a
terminal only."""

import io
import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch

import dare_plugin_samplers
from dare_core.config import resolve
from dare_core.errors import DivergenceError
from dare_core.plugins import build
from dare_core.rundir import RunDir
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.train import train
from dare_core.workflows.checkpoint import save_final
from dare_core.workflows.evaluation import evaluate
from dare_core.workflows.runtime import eval_context, setup
from dare_core.workflows.tracker import Tracker, strict

TINY = [
    "task.name=digits",
    "task.num_eval=4",
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "rollout.steps=4",
    "rollout.temperature=1.0",
    "progress=false",
    "seed=3",
    "trainer.batch_size=4",
    "trainer.group_size=2",
    "trainer.micro_batch_size=4",
    "model.device=cpu",
]
#: at this learning rate the first update destroys the toy model: every later loss is NaN
DIVERGE = [
    "trainer.lr=1e10",
    "trainer.max_nonfinite_steps=2",
    "trainer.steps=6",
    "eval.before=false",
    "eval.after=true",
]


@pytest.fixture
def dare():
    return build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, toy, DigitsPlugin()])


def _config(dare, tmp_path, algo, name, *extra):
    return resolve(
        dare,
        algo=algo,
        model="toy",
        overrides=[*TINY, f"model.path={tmp_path / 'ckpt'}", f"output_dir={tmp_path}", f"run_name={name}", *extra],
    )


def strict_lines(path):
    """The records of a JSON-lines file, refusing NaN / Infinity as strict JSON does."""

    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not strict JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("algo", ["sup_test", "pg_test"])
def test_nonfinite_steps_in_a_row_stop_the_run(dare, tmp_path, capsys, algo):
    with pytest.raises(DivergenceError) as info:
        train(dare, _config(dare, tmp_path, algo, "r", *DIVERGE))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("training diverged at step 3: non-finite loss and grad_norm for 2 steps")
    assert "trainer.lr" in message and "trainer.max_nonfinite_steps" in message
    err = capsys.readouterr().err
    assert "step 2: non-finite loss=nan, grad_norm=nan; update skipped (1 of 2 in a row)" in err
    assert "step 3: non-finite loss=nan, grad_norm=nan; update skipped (2 of 2 in a row)" in err
    root = tmp_path / "r"
    # no after-evaluation, no final model, no summary; the metrics so far stay, as strict JSON
    assert not (root / "final").exists() and not (root / "summary.json").exists()
    assert "evaluating" not in err and not (root / "eval_samples").exists()
    lines = strict_lines(root / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert math.isfinite(lines[0]["loss"]) and "nonfinite" not in lines[0]
    for r in lines[1:]:
        assert r["loss"] is None and r["grad_norm"] is None and r["skipped_steps"] == 1
        assert {"loss", "grad_norm"} <= set(r["nonfinite"])


def test_a_finite_step_resets_the_count():
    logged = []
    ctx = SimpleNamespace(config=SimpleNamespace(trainer=SimpleNamespace(max_nonfinite_steps=2)), log=logged.append)
    tracker = Tracker(ctx, [])
    for step, loss in enumerate([math.nan, 1.0, math.inf], 1):
        tracker._guard(step, {"loss": loss, "grad_norm": 0.5, "skipped_steps": 0})
    assert logged == [
        "step 1: non-finite loss=nan; update applied (1 of 2 in a row)",
        "step 3: non-finite loss=inf; update applied (1 of 2 in a row)",
    ]
    with pytest.raises(DivergenceError, match="at step 4: non-finite grad_norm for 2 steps"):
        tracker._guard(4, {"loss": 1.0, "grad_norm": math.nan, "skipped_steps": 1})


def test_strict_records_flag_nonfinite_values_as_null():
    record = strict({"step": 2, "loss": math.nan, "lr": 1e-3, "eval_pairs": {"dpo_loss": -math.inf, "n": 4}})
    assert record == {
        "step": 2,
        "loss": None,
        "lr": 1e-3,
        "eval_pairs": {"dpo_loss": None, "n": 4},
        "nonfinite": ["loss", "eval_pairs.dpo_loss"],
    }
    json.dumps(record, allow_nan=False)
    assert strict({"loss": 1.0}) == {"loss": 1.0}


def test_divergence_is_one_error_line_and_status_2_from_the_cli(dare, dare_cli, tmp_path):
    result = dare_cli(dare)(
        "train",
        "--algo",
        "sup_test",
        "--model",
        "toy",
        *TINY,
        *DIVERGE,
        f"model.path={tmp_path / 'ckpt'}",
        f"output_dir={tmp_path}",
        "run_name=cli",
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.strip().splitlines()[-1]]
    assert errors[0].startswith("error: training diverged at step 3")
    assert not (tmp_path / "cli" / "final").exists()


def test_nonfinite_weights_are_never_written(dare, tmp_path):
    cfg = _config(
        dare,
        tmp_path,
        "sup_test",
        "w",
        "trainer.steps=1",
        "trainer.save_every=1",
        "eval.before=false",
        "eval.after=false",
    )
    train(dare, cfg)
    root = tmp_path / "w"
    kept = {
        p: (root / p).read_bytes()
        for p in ("checkpoints/step-1/toy.pt", "checkpoints/step-1/trainer_state.json", "final/toy.pt")
    }
    ctx = setup(dare, cfg, rundir=RunDir(str(root)))
    ctx.engine.setup_optimizer(ctx.wrapper, cfg.trainer)
    with torch.no_grad():
        next(ctx.wrapper.module.parameters()).view(-1)[0] = math.nan
    with pytest.raises(DivergenceError, match=r"not writing step-2: weight \S+ is not finite"):
        Tracker(ctx, []).checkpoint(2)
    with pytest.raises(DivergenceError, match="not writing final: weight"):
        save_final(ctx)
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["step-1"]
    assert {p: (root / p).read_bytes() for p in kept} == kept
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_the_rl_console_line_shows_what_moves(dare, tmp_path, capsys):
    """With one update per batch the clipped surrogate is at ratio 1 (its loss -mean(A), clip
    fraction and KL 0): the line leaves them out; with two epochs it shows them."""
    lines = {}
    for epochs in (1, 2):
        train(
            dare,
            _config(
                dare,
                tmp_path,
                "pg_test",
                f"e{epochs}",
                "trainer.steps=1",
                f"trainer.ppo_epochs={epochs}",
                "eval.before=false",
                "eval.after=false",
                "trainer.save_final=false",
            ),
        )
        lines[epochs] = next(l for l in capsys.readouterr().err.splitlines() if l.startswith("step 1 "))
    for key in ("reward=", "accuracy=", "grad_norm=", "response_length=", "rollout_tokens_per_s="):
        assert key in lines[1] and key in lines[2]
    for key in ("loss=", "pg_clipfrac=", "ppo_kl="):
        assert key not in lines[1] and key in lines[2]


def test_evaluation_shows_a_progress_bar_on_a_terminal_only(dare, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for progress, stream, shown in (
        ("true", Terminal(), True),
        ("true", io.StringIO(), False),
        ("false", Terminal(), False),
    ):
        cfg = resolve(
            dare,
            model="toy",
            need_algo=False,
            overrides=[*TINY, f"model.path={tmp_path / 'ckpt'}", f"progress={progress}"],
        )
        ctx = eval_context(dare, cfg)
        monkeypatch.setattr(sys, "stderr", stream)
        result = evaluate(ctx, ctx.task.examples("eval", limit=4), "before")
        assert result["n"] == 4
        assert ("eval before" in stream.getvalue()) == shown, (progress, stream.getvalue())


def test_max_nonfinite_steps_is_at_least_one(dare, tmp_path):
    from dare_core.errors import ConfigError

    assert _config(dare, tmp_path, "sup_test", "c").trainer.max_nonfinite_steps == 3
    with pytest.raises(ConfigError, match="trainer.max_nonfinite_steps: must be > 0, got 0"):
        _config(dare, tmp_path, "sup_test", "c", "trainer.max_nonfinite_steps=0")
