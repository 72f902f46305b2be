"""The run directory: atomic writes, never overwriting a finished run, metrics.jsonl."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

import dare_core.rundir as rundir_mod
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


def test_create_never_overwrites_a_finished_named_run(tmp_path):
    first = RunDir.create(str(tmp_path), "exp", "algo_a-toy")
    assert first.root == str(tmp_path / "exp")
    again = RunDir.create(str(tmp_path), "exp", "algo_a-toy")
    assert again.root == first.root  # not finished yet: the same directory
    _finish(first)
    second = RunDir.create(str(tmp_path), "exp", "algo_a-toy")
    assert second.root == str(tmp_path / "exp-1")
    _finish(second)
    assert RunDir.create(str(tmp_path), "exp", "x").root == str(tmp_path / "exp-2")
    assert json.loads((tmp_path / "exp" / "summary.json").read_text()) == {"done": True}


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

