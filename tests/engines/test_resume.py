"""Exact resume: a run killed (SIGKILL) at a random step and continued with
``trainer.resume=auto`` writes the same per-step metrics and final weights as the uninterrupted
run — in one process, and when one rank of two dies; a checkpoint cut off mid-write is skipped
with a warning; resuming refuses what would make the continuation wrong."""

import json
import os
import random
import sys

import pytest
import torch

from dare_core.errors import DareError
from dare_core.testing.distributed import RankFailed, run_ranks
from dare_core.testing.engines import TINY, max_weight_diff, same_records, train_run

sys.path.insert(0, os.path.dirname(__file__))  # the spawned ranks import kill_at by name
KILL = ("kill_at:KillAt",)
# the uninterrupted runs train in this process: the spawned ones use as many threads, so that
# float reductions, and so the results, are bit-identical
THREADS = {"OMP_NUM_THREADS": str(torch.get_num_threads())}
STEPS = 5


def _common(tmp_path, name, *extra):
    return [
        *TINY,
        f"trainer.steps={STEPS}",
        "trainer.save_every=1",
        f"model.path={tmp_path / 'ckpt'}",
        f"output_dir={tmp_path}",
        f"run_name={name}",
        *extra,
    ]


def _killed(tmp_path, nprocs, rank, step, when, algo="pg_test", extra=()):
    with pytest.raises(RankFailed) as info:
        run_ranks(
            nprocs,
            train_run,
            KILL,
            algo,
            _common(tmp_path, "cut") + list(extra),
            env={**THREADS, "DARE_TEST_KILL_AT": f"{rank}:{step}:{when}"},
        )
    assert -9 in info.value.exitcodes  # SIGKILL, not an exception


@pytest.mark.parametrize("algo", ["pg_test", "sup_test"])
def test_single_process_resume_equals_the_uninterrupted_run(tmp_path, algo):
    full = train_run((), algo, _common(tmp_path, "full"))
    step = random.randint(2, STEPS - 1)
    _killed(tmp_path, 1, 0, step, "step", algo)
    # the killed run wrote the metrics of `step`, whose checkpoint it never finished
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == step
    resumed = run_ranks(1, train_run, (), algo, _common(tmp_path, "cut", "trainer.resume=auto"), env=THREADS)[0]
    assert same_records(full["records"], resumed["records"], rel=0.0) == [], step
    assert max_weight_diff(full["weights"], resumed["weights"]) == 0.0


def test_a_checkpoint_cut_off_mid_write_is_skipped(tmp_path, capfd):
    full = train_run((), "pg_test", _common(tmp_path, "full"))
    _killed(tmp_path, 1, 0, 3, "save")
    ckpts = tmp_path / "cut" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [".tmp-step-3", "step-1", "step-2"]
    resumed = run_ranks(1, train_run, (), "pg_test", _common(tmp_path, "cut", "trainer.resume=auto"), env=THREADS)[0]
    err = capfd.readouterr().err
    assert "warning: skipping checkpoint step-3, cut off mid-write" in err
    assert "resumed from" in err and "step-2" in err
    assert same_records(full["records"], resumed["records"], rel=0.0) == []
    assert max_weight_diff(full["weights"], resumed["weights"]) == 0.0
    assert not (ckpts / ".tmp-step-3").exists()


def test_one_rank_of_two_killed_then_resumed_equals_one_uninterrupted_process(tmp_path):
    full = train_run((), "pg_test", _common(tmp_path, "full"))
    _killed(tmp_path, 2, 1, random.randint(2, STEPS - 1), "step", extra=["engine.name=ddp"])
    resumed = run_ranks(
        2, train_run, (), "pg_test", _common(tmp_path, "cut", "engine.name=ddp", "trainer.resume=auto")
    )[0]
    assert same_records(full["records"], resumed["records"]) == []
    assert max_weight_diff(full["weights"], resumed["weights"]) <= 1e-6


def test_keep_last_keeps_the_newest_checkpoints(tmp_path):
    train_run((), "sup_test", _common(tmp_path, "k", "trainer.keep_last=2"))
    assert sorted(p.name for p in (tmp_path / "k" / "checkpoints").iterdir()) == ["step-4", "step-5"]


def test_resume_refuses_a_changed_field_a_missing_checkpoint_and_another_engine(tmp_path):
    _killed(tmp_path, 1, 0, 3, "step")
    for extra, expected in [
        (["trainer.lr=0.5"], "trainer.resume: trainer.lr was 5e-07 in the run of .*step-2, now 0.5"),
        ([f"trainer.resume={tmp_path}"], "no training checkpoint there"),
    ]:
        with pytest.raises(DareError, match=expected):
            train_run((), "pg_test", _common(tmp_path, "cut", "trainer.resume=auto", *extra))
    with pytest.raises(RankFailed, match="trainer.resume: engine.name was 'single'"):
        run_ranks(2, train_run, (), "pg_test", _common(tmp_path, "cut", "engine.name=ddp", "trainer.resume=auto"))


@pytest.mark.parametrize("nprocs", [1, 3])
def test_a_checkpoint_of_two_ranks_resumes_on_another_world_size(tmp_path, nprocs):
    """ddp's state is the whole model: a checkpoint two ranks wrote continues on one and on
    three (a rank it lacks takes rank 0's data position), equal to the uninterrupted run."""
    full = train_run((), "pg_test", _common(tmp_path, "full", "trainer.batch_size=6"))
    _killed(tmp_path, 2, 1, 3, "step", extra=["engine.name=ddp", "trainer.batch_size=6"])
    resumed = run_ranks(
        nprocs,
        train_run,
        (),
        "pg_test",
        _common(tmp_path, "cut", "engine.name=ddp", "trainer.batch_size=6", "trainer.resume=auto"),
    )[0]
    assert same_records(full["records"], resumed["records"]) == []
    assert max_weight_diff(full["weights"], resumed["weights"]) <= 1e-6


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_stop_signal_checkpoints_and_resume_equals_the_uninterrupted_run(tmp_path, nprocs):
    """SIGTERM (to the last rank only, with 2) at the end of a step: every rank finishes the step,
    the step's training checkpoint is written without ``save_every`` and the run stops with
    ``Preempted`` (exit status 75 from the CLI); ``trainer.resume=auto`` then writes the same
    metrics and weights as the uninterrupted run (exactly in one process; 2 ranks against one
    process within the float error of their gradient all-reduce)."""
    engine = ["engine.name=ddp"] if nprocs == 2 else []
    full = train_run((), "pg_test", _common(tmp_path, "full"))
    step = random.randint(2, STEPS - 1)
    cut = [a for a in _common(tmp_path, "cut", *engine) if a != "trainer.save_every=1"]
    with pytest.raises(RankFailed) as info:
        run_ranks(
            nprocs, train_run, KILL, "pg_test", cut, env={**THREADS, "DARE_TEST_KILL_AT": f"{nprocs - 1}:{step}:term"}
        )
    assert f"Preempted: stopped after step {step} of {STEPS} by " in str(info.value)
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == [f"step-{step}"]
    resumed = run_ranks(nprocs, train_run, (), "pg_test", cut + ["trainer.resume=auto"], env=THREADS)[0]
    exact = nprocs == 1
    assert same_records(full["records"], resumed["records"], rel=0.0 if exact else 1e-5) == [], step
    assert max_weight_diff(full["weights"], resumed["weights"]) <= (0.0 if exact else 1e-6)


def test_preempted_is_exit_status_75():
    from dare_core.errors import Preempted

    assert Preempted("x").exit_status == 75 and DareError("x").exit_status == 2
