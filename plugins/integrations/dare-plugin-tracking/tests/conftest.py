"""Fixtures of the tracking plugin's tests.

``src/`` is put on ``sys.path`` when the package is not installed (a no-op after
``pip install -e .``). Every test runs with W&B confined to its ``tmp_path`` and offline-only
settings (no network, no login, no console capture), and ``wandb_log`` reads an offline run back
from its ``run-<id>.wandb`` file.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import sys
import time

import pytest

if importlib.util.find_spec("dare_plugin_tracking") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


@pytest.fixture(autouse=True)
def wandb_sandbox(tmp_path, monkeypatch):
    """W&B's own folders (settings, cache, artifacts) inside ``tmp_path``; quiet; no API key."""
    home = tmp_path / "wandb-home"
    for var, sub in (
        ("WANDB_DIR", "dir"),
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ):
        (home / sub).mkdir(parents=True)
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    # the service flushes the run file every 15 s by default; the tests read it right away
    monkeypatch.setenv("WANDB__TRANSACTION_LOG_FLUSH_INTERVAL", "0.1")
    for var in (
        "WANDB_MODE",
        "WANDB_API_KEY",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_NAME",
        "WANDB_TAGS",
        "WANDB_RUN_ID",
    ):
        monkeypatch.delenv(var, raising=False)
    yield
    from dare_plugin_tracking import tracked_run

    assert tracked_run.active() is None, "a test left a tracked run open"


# The .wandb file is W&B's transaction log: a 7-byte header (":W&B", magic 0xBEE1, version 0),
# then LevelDB-log records in 32 KiB blocks, each chunk a 7-byte header (crc32, length, type:
# 1 full, 2 first, 3 middle, 4 last) and data; a record is a serialised wandb_internal.Record.
_BLOCK = 32 * 1024
_CHUNK = 7


def _records(path: str) -> list[bytes]:
    with open(path, "rb") as fh:
        data = fh.read()
    ident, magic, version = struct.unpack("<4sHB", data[:7])  # struct.error while still empty
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, parts, pos = [], [], 7
    while pos + _CHUNK <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK:  # the rest of a block too small for a chunk header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK])
        if pos + _CHUNK + length > len(data):  # the writer is not done with this chunk yet
            break
        chunk = data[pos + _CHUNK : pos + _CHUNK + length]
        pos += _CHUNK + length
        if kind == 1:
            out.append(chunk)
        elif kind in (2, 3):
            parts.append(chunk)
        elif kind == 4:
            out.append(b"".join(parts) + chunk)
            parts = []
    return out


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_wandb_run(run_root: str, timeout: float = 60.0) -> dict:
    """The offline W&B run under ``run_root`` (``<dir>/wandb/offline-run-*``): ``history``
    (step -> row of user metrics), ``summary``, ``config``, ``name``, ``tags``, ``exit_code``.

    W&B's service writes the file in the background and may still be writing it when
    ``run.finish()`` has returned, so the file is read again until it ends with the run's exit
    record (or ``timeout`` seconds have passed).
    """
    from google.protobuf.message import DecodeError

    (path,) = glob.glob(os.path.join(run_root, "wandb", "offline-run-*", "run-*.wandb"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            out = _parse(path)
        except (DecodeError, struct.error):  # a record cut by a flush still in progress
            out = None
        if out is not None and out["exit_code"] is not None:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} holds no exit record after {timeout} s")
        time.sleep(0.1)


def _parse(path: str) -> dict:
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict = {"history": {}, "summary": {}, "config": {}, "exit_code": None}
    for raw in _records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["name"], out["tags"] = rec.run.display_name, list(rec.run.tags)
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in rec.history.item}
            out["history"][rec.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
    out["summary"] = {k: v for k, v in out["summary"].items() if not k.startswith("_")}
    return out


@pytest.fixture
def wandb_run():
    """``wandb_run(run_root)`` → the offline W&B run written under ``run_root``."""
    return read_wandb_run
