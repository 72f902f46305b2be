"""Every bad input is refused in one line before work starts (docs/reliability.md).

A table of malformed commands, configs, checkpoints, data files and output directories, each run
through the ``dare`` command line over the repository's own plugins. Every case must exit with
status 2, print exactly one ``error:`` line on stderr naming the problem (the ``expect`` words),
print no traceback, leave no run directory behind and write nothing in the working directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional, Union

import attrs
import pytest
from click.testing import CliRunner

from dare_core.cli import cli
from dare_core.plugins import get_dare, reset


@attrs.frozen
class Case:
    id: str
    args: tuple[str, ...]
    expect: tuple[str, ...]
    #: ``setup(tmp) -> dict`` prepares files; its values fill ``{name}`` fields of ``args``
    setup: Optional[Callable[[Path], dict]] = None
    #: free bytes the output directory's file system reports (``shutil.disk_usage``)
    free_bytes: Optional[int] = None


def _family_checkpoint(family: str) -> Path:
    return Path(get_dare().registries.models.get(family).default_checkpoint)


def _copy(tmp: Path, family: str = "llada") -> Path:
    dst = tmp / f"ckpt-{family}"
    if not dst.exists():
        shutil.copytree(_family_checkpoint(family), dst)
    return dst


def damaged(change: Callable[[Path], None], family: str = "llada") -> Callable[[Path], dict]:
    """A setup giving ``{ckpt}``: a copy of ``family``'s bundled checkpoint changed by ``change``."""

    def setup(tmp: Path) -> dict:
        ckpt = _copy(tmp, family)
        change(ckpt)
        return {"ckpt": str(ckpt)}

    return setup


def _truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def change(ckpt: Path) -> None:
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: int(len(data) * keep)])

    return change


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda ckpt: (ckpt / name).write_text(text)


def _remove(name: str) -> Callable[[Path], None]:
    return lambda ckpt: (ckpt / name).unlink()


def _only_model_type(ckpt: Path) -> None:
    model_type = json.loads((ckpt / "config.json").read_text())["model_type"]
    (ckpt / "config.json").write_text(json.dumps({"model_type": model_type}))


def _file(name: str, text: Union[str, bytes] = "x") -> Callable[[Path], dict]:
    def setup(tmp: Path) -> dict:
        if isinstance(text, bytes):
            (tmp / name).write_bytes(text)
        else:
            (tmp / name).write_text(text)
        return {name.replace(".", "_"): str(tmp / name)}

    return setup


def _existing_run(tmp: Path) -> dict:
    run = tmp / "runs" / "taken"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return {}


TRAIN = (
    "train",
    "--algo",
    "sft",
    "--model",
    "llada",
    "trainer.steps=1",
    "eval.before=false",
    "eval.after=false",
    "progress=false",
)
RL = (
    "train",
    "--algo",
    "cj_grpo",
    "--model",
    "llada",
    "trainer.steps=1",
    "eval.before=false",
    "eval.after=false",
    "progress=false",
)
GEN = ("generate", "--model", "llada")
EVAL = ("eval", "--model", "llada", "task.num_eval=2")

CASES = [
    # ---- unknown names (close matches, install hints)
    Case("unknown-algo", ("train", "--algo", "cj_grp", "--model", "llada"), ("unknown algorithm", "cj_grpo")),
    Case("unknown-model", ("train", "--algo", "sft", "--model", "lada"), ("unknown model", "llada")),
    Case("unknown-model-generate", ("generate", "--model", "dram", "--prompt", "hi"), ("unknown model", "dream")),
    Case("unknown-model-eval", ("eval", "--model", "sdr"), ("unknown model", "sdar")),
    Case("unknown-algo-config-show", ("config", "show", "--algo", "nope", "--model", "llada"), ("unknown algorithm",)),
    Case("unknown-task", TRAIN + ("task.name=gsm8",), ("unknown task", "gsm8k")),
    Case("unknown-rollout-backend", RL + ("rollout.backend=low_confidenc",), ("low_confidence",)),
    Case("unknown-eval-backend", TRAIN + ("eval.backend=nope",), ("nope",)),
    Case("unknown-engine", TRAIN + ("engine.name=fsdq",), ("unknown engine", "fsdp")),
    Case("unknown-list-kind", ("list", "bogus"), ("bogus",)),
    Case("unknown-command", ("trian",), ("trian",)),
    Case("missing-option", ("train", "--model", "llada"), ("--algo",)),
    Case("unknown-flag", TRAIN + ("--bogus-flag",), ("--bogus-flag",)),
    # ---- typed config errors, reported together
    Case("float-not-a-number", TRAIN + ("trainer.lr=abc",), ("trainer.lr",)),
    Case("negative-steps", TRAIN + ("trainer.steps=-1",), ("trainer.steps",)),
    Case("fractional-steps", TRAIN + ("trainer.steps=1.5",), ("trainer.steps",)),
    Case("unknown-key", TRAIN + ("trainer.foo=1",), ("trainer.foo",)),
    Case("unknown-section", TRAIN + ("foo.bar=1",), ("foo",)),
    Case(
        "two-errors-at-once", TRAIN + ("trainer.lr=abc", "trainer.batch_size=-2"), ("trainer.lr", "trainer.batch_size")
    ),
    Case("override-without-equals", TRAIN + ("trainer.lr",), ("trainer.lr",)),
    Case("bad-literal", TRAIN + ("model.cross_entropy=bogus",), ("model.cross_entropy",)),
    Case("bad-precision", TRAIN + ("engine.precision=fp8",), ("engine.precision",)),
    Case("pure-bf16-without-update", TRAIN + ("engine.precision=bf16",), ("engine.bf16_update",)),
    Case("bad-reward", TRAIN + ("task.reward=maybe",), ("task.reward",)),
    Case("bad-bool", TRAIN + ("eval.before=maybe",), ("eval.before",)),
    Case("warmup-above-one", TRAIN + ("trainer.warmup_ratio=2",), ("trainer.warmup_ratio",)),
    Case("zero-micro-batch", TRAIN + ("trainer.micro_batch_size=0",), ("trainer.micro_batch_size",)),
    Case("zero-batch", TRAIN + ("trainer.batch_size=0",), ("trainer.batch_size",)),
    Case("bad-dtype", TRAIN + ("model.dtype=float8",), ("model.dtype",)),
    Case("bad-seed", TRAIN + ("seed=abc",), ("seed",)),
    Case("algorithm-option-range", RL + ("algorithm.clip_ratio_low=-1",), ("clip_ratio_low",)),
    Case("algorithm-unknown-option", RL + ("algorithm.clip=0.2",), ("algorithm.clip",)),
    Case("block-does-not-divide", RL + ("rollout.gen_length=40", "rollout.block_length=7"), ("block_length",)),
    Case("zero-gen-length", RL + ("rollout.gen_length=0",), ("gen_length",)),
    Case("plugin-section-range", TRAIN + ("deepspeed.zero_stage=5",), ("deepspeed.zero_stage",)),
    Case("lora-rank-zero", TRAIN + ("model.lora.rank=0",), ("model.lora.rank",)),
    # ---- config files
    Case("config-file-missing", TRAIN + ("--config", "{tmp}/missing.yaml"), ("missing.yaml",)),
    Case(
        "config-file-bad-yaml",
        TRAIN + ("--config", "{bad_yaml}"),
        ("bad.yaml",),
        setup=_file("bad.yaml", "trainer: {lr: [1,\n"),
    ),
    Case(
        "config-file-list", TRAIN + ("--config", "{list_yaml}"), ("list.yaml",), setup=_file("list.yaml", "- 1\n- 2\n")
    ),
    Case(
        "config-file-not-utf8",
        TRAIN + ("--config", "{latin1_yaml}"),
        ("latin1.yaml", "utf-8"),
        setup=_file("latin1.yaml", b"seed: \xff\n"),
    ),
    Case(
        "config-file-unknown-key",
        TRAIN + ("--config", "{keys_yaml}"),
        ("trainer.nope",),
        setup=_file("keys.yaml", "trainer:\n  nope: 1\n"),
    ),
    Case("config-file-is-directory", TRAIN + ("--config", "{tmp}"), ("config",)),
    # ---- checkpoints
    Case("checkpoint-missing", TRAIN + ("model.path={tmp}/nowhere",), ("nowhere",)),
    Case("checkpoint-is-file", TRAIN + ("model.path={a_txt}",), ("a.txt",), setup=_file("a.txt")),
    Case("checkpoint-path-empty", TRAIN + ("model.path=",), ("model.path",)),
    Case(
        "config-json-missing", TRAIN + ("model.path={ckpt}",), ("config.json",), setup=damaged(_remove("config.json"))
    ),
    Case(
        "config-json-truncated",
        TRAIN + ("model.path={ckpt}",),
        ("config.json",),
        setup=damaged(_truncate("config.json")),
    ),
    Case(
        "config-json-not-object",
        TRAIN + ("model.path={ckpt}",),
        ("config.json",),
        setup=damaged(_write("config.json", "[1, 2]")),
    ),
    Case("config-json-incomplete", TRAIN + ("model.path={ckpt}",), ("config.json",), setup=damaged(_only_model_type)),
    Case(
        "checkpoint-of-other-family", TRAIN + ("model.path={ckpt}",), ("sdar",), setup=damaged(lambda c: None, "sdar")
    ),
    Case(
        "checkpoint-of-other-family-generate",
        GEN + ("--prompt", "hi", "model.path={ckpt}"),
        ("sdar",),
        setup=damaged(lambda c: None, "sdar"),
    ),
    Case("weights-missing", TRAIN + ("model.path={ckpt}",), ("weights",), setup=damaged(_remove("model.safetensors"))),
    Case(
        "weights-truncated",
        TRAIN + ("model.path={ckpt}",),
        ("model.safetensors",),
        setup=damaged(_truncate("model.safetensors", 0.9)),
    ),
    Case(
        "weights-header-garbage",
        TRAIN + ("model.path={ckpt}",),
        ("model.safetensors",),
        setup=damaged(_write("model.safetensors", "not a safetensors file")),
    ),
    Case(
        "weights-truncated-eval",
        EVAL + ("model.path={ckpt}",),
        ("model.safetensors",),
        setup=damaged(_truncate("model.safetensors", 0.5)),
    ),
    Case(
        "tokenizer-corrupt",
        TRAIN + ("model.path={ckpt}",),
        ("tokenizer.json",),
        setup=damaged(_truncate("tokenizer.json")),
    ),
    Case(
        "tokenizer-config-corrupt",
        TRAIN + ("model.path={ckpt}",),
        ("tokenizer_config.json",),
        setup=damaged(_truncate("tokenizer_config.json")),
    ),
    # ---- output directory
    Case("output-dir-is-file", TRAIN + ("output_dir={a_txt}",), ("a.txt",), setup=_file("a.txt")),
    Case("output-dir-under-file", TRAIN + ("output_dir={a_txt}/runs",), ("a.txt",), setup=_file("a.txt")),
    Case("output-dir-full", TRAIN + ("output_dir={tmp}/full",), ("space",), free_bytes=1000),
    # ---- semantic checks
    Case("group-of-one", RL + ("trainer.group_size=1",), ("group_size",)),
    Case("eval-backend-not-for-family", TRAIN + ("eval.backend=block_confidence",), ("block_confidence",)),
    Case("empty-prompt", GEN + ("--prompt", ""), ("prompt",)),
    Case("blank-prompt", GEN + ("--prompt", "   "), ("prompt",)),
    # undecodable argv bytes reach Python as lone surrogates (PEP 383): b"hi\xff" is "hi\udcff"
    Case("prompt-invalid-utf8", GEN + ("--prompt", "hi\udcff"), ("not valid utf-8", "hi\\xff")),
    Case("prompt-beyond-context", GEN + ("--prompt", "7 " * 5000), ("context",)),
    Case("generation-beyond-context", RL + ("rollout.gen_length=100000", "rollout.block_length=100000"), ("context",)),
    Case("prompt-too-long-for-run", RL + ("trainer.max_prompt_length=3",), ("max_prompt_length",)),
    # ---- run directories
    Case("run-name-taken", TRAIN + ("run_name=taken",), ("taken", "--overwrite"), setup=_existing_run),
    Case("resume-missing", TRAIN + ("trainer.resume={tmp}/nowhere",), ("nowhere",)),
    Case("resume-auto-without-name", TRAIN + ("trainer.resume=auto",), ("run_name",)),
    # ---- data files
    Case("train-data-missing", TRAIN + ("task.name=gsm8k", "task.train_path={tmp}/train.parquet"), ("train.parquet",)),
    Case("eval-data-missing", EVAL + ("task.name=gsm8k", "task.eval_path={tmp}/test.jsonl"), ("test.jsonl",)),
    Case(
        "train-data-corrupt",
        TRAIN + ("task.name=gsm8k", "task.train_path={bad_parquet}"),
        ("bad.parquet",),
        setup=_file("bad.parquet", "not parquet"),
    ),
    Case(
        "train-data-bad-rows",
        TRAIN + ("task.name=gsm8k", "task.train_path={rows_jsonl}"),
        ("rows.jsonl",),
        setup=_file("rows.jsonl", '{"unrelated": 1}\n'),
    ),
    Case(
        "train-data-unsupported-format",
        TRAIN + ("task.name=gsm8k", "task.train_path={d_csv}"),
        ("d.csv",),
        setup=_file("d.csv", "a,b\n"),
    ),
]


def _fill(args: tuple[str, ...], values: dict) -> list[str]:
    return [a.format(**values) if "{" in a and "}" in a and not a.startswith('{"') else a for a in args]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_before_work(case: Case, tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    values = {"tmp": str(work)}
    if case.setup is not None:
        values.update(case.setup(work))
    monkeypatch.chdir(work)
    if case.free_bytes is not None:
        usage = shutil._ntuple_diskusage(10**12, 10**12 - case.free_bytes, case.free_bytes)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    before = _tree(work)
    result = CliRunner().invoke(cli, _fill(case.args, values), catch_exceptions=True)
    out, err = result.stdout, result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {type(result.exception).__name__}: {result.exception}"
    )
    assert result.exit_code == 2, f"exit {result.exit_code}; stderr: {err[-2000:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line:\n{err[-3000:]}"
    assert "Traceback" not in out + err
    message = lines[0].lower()
    for word in case.expect:
        assert word.lower() in message, f"{word!r} not in {lines[0]!r}"
    assert _tree(work) == before, f"files written: {sorted(_tree(work) - before)}"


@pytest.mark.parametrize("variable", ["DARE_PLUGINS", "DARE_DISABLE_PLUGINS"])
def test_unknown_plugin_id_in_environment(variable: str, tmp_path: Path) -> None:
    env = dict(os.environ, **{variable: "sdar,no_such_plugin"})
    proc = subprocess.run(
        [sys.executable, "-m", "dare_core", "list"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "no_such_plugin" in lines[0] and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_table_covers_every_class() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture(autouse=True, scope="module")
def _fresh_plugins():
    reset()
    yield
    reset()
