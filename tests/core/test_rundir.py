"""The run directory: atomic writes, exclusive claims (--overwrite), temp cleanup, metrics.jsonl."""

from __future__ import annotations

import json
import os
import stat
import threading
import types

import pytest
import yaml
from click.testing import CliRunner

import dare_core.rundir as rundir_mod
import dare_core.train as train_mod
from dare_core.cli import cli
from dare_core.config import resolve
from dare_core.errors import DareError
from dare_core.interfaces import WorkflowSpec
from dare_core.rundir import RunDir, atomic_write_text


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith((".tmp-", ".old-")))


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_write_text_creates_and_replaces(tmp_path):
    target = tmp_path / "sub" / "file.txt"
    atomic_write_text(str(target), "one")
    atomic_write_text(str(target), "two")
    assert target.read_text() == "two"
    assert _leftovers(target.parent) == []
    assert _mode(target) == 0o666 & ~_umask()  # like a plain open(), not mkstemp's 0600


def test_atomic_write_text_failure_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "file.txt"
    atomic_write_text(str(target), "old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rundir_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(str(target), "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def _finish(run: RunDir) -> None:
    run.write_json("summary.json", {"done": True})


def test_a_named_run_directory_is_claimed_once(tmp_path):
    first = RunDir.create(str(tmp_path), "exp", "algo_a-toy")
    assert first.root == str(tmp_path / "exp")
    first.log_metrics({"step": 1})
    with pytest.raises(DareError) as info:  # finished or not: never shared, never appended to
        RunDir.create(str(tmp_path), "exp", "algo_a-toy")
    assert str(info.value) == (
        f"run directory {tmp_path / 'exp'} exists; choose another run_name, pass "
        f"--overwrite to replace it, or continue it with trainer.resume=auto"
    )
    assert (tmp_path / "exp" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert sorted(os.listdir(tmp_path)) == ["exp"]


def test_overwrite_replaces_a_run_directory_only(tmp_path):
    run = RunDir.create(str(tmp_path), "exp", "algo_a-toy")
    run.write_config({"algo": "a"})
    run.log_metrics({"step": 1})
    again = RunDir.create(str(tmp_path), "exp", "algo_a-toy", overwrite=True)
    assert again.root == run.root and os.listdir(run.root) == []
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(DareError, match="notes is no run directory .*; it is left alone: choose another run_name"):
        RunDir.create(str(tmp_path), "notes", "algo_a-toy", overwrite=True)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_remove_temp_removes_what_interrupted_saves_left(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    for d in ("checkpoints/.tmp-step-3/state", "checkpoints/step-2", ".tmp-final"):
        os.makedirs(run.path(d))
    for f in (".tmp-abc.json", "checkpoints/step-2/.tmp-x", "config.yaml", "checkpoints/step-2/model.safetensors"):
        open(run.path(f), "w").close()
    run.remove_temp()
    left = sorted(
        os.path.relpath(os.path.join(top, n), run.root) for top, dirs, files in os.walk(run.root) for n in dirs + files
    )
    assert left == ["checkpoints", "checkpoints/step-2", "checkpoints/step-2/model.safetensors", "config.yaml"]


def test_create_never_overwrites_a_finished_timestamped_run(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir_mod.time, "strftime", lambda fmt: "20250101-000000")
    first = RunDir.create(str(tmp_path), None, "algo_a-toy")
    assert os.path.basename(first.root) == "algo_a-toy-20250101-000000"
    _finish(first)
    second = RunDir.create(str(tmp_path), None, "algo_a-toy")  # same second, same name
    assert second.root == first.root + "-1"
    assert os.path.isdir(second.root)


def test_timestamped_runs_started_in_the_same_second_never_share_a_directory(tmp_path, monkeypatch):
    # two runs launched together (neither finished) once wrote into one directory
    monkeypatch.setattr(rundir_mod.time, "strftime", lambda fmt: "20250101-000000")
    roots = [RunDir.create(str(tmp_path / "runs"), None, "algo_a-toy").root for _ in range(3)]
    base = str(tmp_path / "runs" / "algo_a-toy-20250101-000000")
    assert roots == [base, base + "-1", base + "-2"]


def test_metrics_jsonl_appends(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    run.log_metrics({"step": 1, "loss": 0.5})
    run.log_metrics({"step": 2, "loss": 0.25})
    RunDir(run.root).log_metrics({"step": 3, "loss": 0.125})  # a new handle appends too
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_concurrent_claims_of_one_name_give_it_to_one_run(tmp_path):
    results: list = []

    def claim():
        try:
            results.append(RunDir.create(str(tmp_path), "exp", "algo_a-toy").root)
        except DareError as exc:
            results.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r for r in results if isinstance(r, str)] == [str(tmp_path / "exp")]
    assert sum(isinstance(r, DareError) for r in results) == 7


# ----------------------------------------------------------------------------- through `dare train`
@pytest.fixture
def stand_in(make_dare, monkeypatch, use_dare):
    """Registries whose rl workflow and set-up are stand-ins (no model): ``during`` holds
    callables the workflow calls; ``setups`` the run directories set up."""
    d = use_dare(make_dare())
    state = types.SimpleNamespace(dare=d, during=[], setups=[])

    def fake_setup(dare, cfg, *, rundir, **_engine_resume_task):
        state.setups.append(rundir.root)
        rundir.write_config({"algo": cfg.algo})
        return types.SimpleNamespace(engine=types.SimpleNamespace(is_main=True), log=lambda m: None)

    def workflow(ctx):
        for fn in state.during:
            fn()
        return {"eval": {}, "final_checkpoint": None}

    monkeypatch.setattr(train_mod, "setup", fake_setup)
    monkeypatch.setitem(d.registries.workflows._items, "rl", WorkflowSpec("rl", workflow, "a stand-in"))
    return state


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="dare")


def _old_run(root):
    os.makedirs(root / "checkpoints" / ".tmp-step-3")
    os.makedirs(root / ".tmp-final")
    (root / "config.yaml").write_text("algo: old\n")
    (root / "metrics.jsonl").write_text('{"step": 1, "run": "old"}\n')
    (root / ".tmp-abc.json").write_text("{")


def _train_args(tmp_path, ckpt, *more):
    return (
        "train",
        "--algo",
        "algo_a",
        "--model",
        "toy",
        f"model.path={ckpt}",
        f"output_dir={tmp_path / 'runs'}",
        "run_name=exp",
        *more,
    )


def test_an_existing_run_name_is_refused_and_left_as_it_was(stand_in, tmp_path, ckpt):
    root = tmp_path / "runs" / "exp"
    _old_run(root)
    before = sorted(os.walk(root))
    result = _cli(*_train_args(tmp_path, ckpt))
    assert result.exit_code == 2 and "Traceback" not in result.output and result.stdout == ""
    assert result.stderr == (
        f"error: run directory {root} exists; choose another run_name, pass --overwrite "
        f"to replace it, or continue it with trainer.resume=auto\n"
    )
    assert sorted(os.walk(root)) == before and stand_in.setups == []
    assert (root / "metrics.jsonl").read_text() == '{"step": 1, "run": "old"}\n'


def test_overwrite_replaces_the_old_run(stand_in, tmp_path, ckpt):
    root = tmp_path / "runs" / "exp"
    _old_run(root)
    result = _cli(*_train_args(tmp_path, ckpt), "--overwrite")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(root)) == ["config.yaml", "summary.json"]
    assert yaml.safe_load((root / "config.yaml").read_text()) == {"algo": "algo_a"}
    line = _cli(*_train_args(tmp_path, ckpt, "trainer.resume=auto"), "--overwrite").stderr
    assert line == "error: --overwrite replaces a run and trainer.resume continues one; pass one of them\n"


def test_a_run_started_while_one_of_the_same_name_runs_is_refused(stand_in, tmp_path, ckpt):
    config = resolve(
        stand_in.dare,
        algo="algo_a",
        model="toy",
        overrides=[f"model.path={ckpt}", f"output_dir={tmp_path / 'runs'}", "run_name=exp"],
    )
    second: list = []

    def start_another():
        with pytest.raises(DareError, match="run directory .*exp exists") as info:
            train_mod.train(stand_in.dare, config)
        second.append(str(info.value))

    stand_in.during.append(start_another)
    summary = train_mod.train(stand_in.dare, config)
    assert len(second) == 1 and stand_in.setups == [summary["run_dir"]]
    assert os.listdir(tmp_path / "runs") == ["exp"]


def test_resume_removes_the_temp_entries_of_an_interrupted_save(stand_in, tmp_path, ckpt):
    root = tmp_path / "runs" / "exp"
    _old_run(root)
    result = _cli(*_train_args(tmp_path, ckpt, "trainer.resume=auto"))
    assert result.exit_code == 0, result.output
    assert "warning: skipping checkpoint step-3, cut off mid-write" in result.stderr
    left = sorted(
        os.path.relpath(os.path.join(top, n), root) for top, dirs, files in os.walk(root) for n in dirs + files
    )
    assert left == ["checkpoints", "config.yaml", "metrics.jsonl", "summary.json"]
    assert (root / "metrics.jsonl").read_text() == ""  # no checkpoint: afresh, without the old records


def test_a_run_that_fails_in_set_up_leaves_no_run_directory(make_dare, tmp_path, ckpt, load_calls):
    d = make_dare()  # the toy family's load fails (it records the call)
    config = resolve(
        d,
        algo="algo_a",
        model="toy",
        overrides=[f"model.path={ckpt}", f"output_dir={tmp_path / 'runs'}", "run_name=exp"],
    )
    with pytest.raises(AssertionError, match="a core test loaded a model"):
        train_mod.train(d, config)
    assert len(load_calls) == 1 and os.listdir(tmp_path / "runs") == []
