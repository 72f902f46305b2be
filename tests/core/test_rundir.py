"""The run directory: atomic writes, exclusive claims (--overwrite), temp cleanup, metrics.jsonl."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

import dare_core.rundir as rundir_mod
from dare_core.errors import DareError
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
    assert str(info.value) == (f"run directory {tmp_path / 'exp'} exists; choose another run_name, pass "
                               f"--overwrite to replace it, or continue it with trainer.resume=auto")
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
    left = sorted(os.path.relpath(os.path.join(top, n), run.root)
                  for top, dirs, files in os.walk(run.root) for n in dirs + files)
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

