"""A quiet console: the README's first command, ``dare eval``, SFT and a 2-rank fsdp and deepspeed
step print no warning and no third-party progress bar (the results on stdout, DARE's own log
lines on stderr). Each runs as a user runs it, in a fresh process on the bundled checkpoint."""

import os
import re
import subprocess
import sys

import pytest

#: what a third-party warning or progress bar looks like on the console
NOISE = re.compile(r"warn|deprecat|it/s\]|%\|", re.IGNORECASE)

SHORT = ["trainer.steps=1", "task.num_eval=4", "eval.batch_size=4"]


def _run(args: list[str], tmp_path, *, ranks: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": ""}
    env.pop("DARE_QUIET", None)
    if ranks > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "-m", "dare_core"]
    else:
        launch = [sys.executable, "-m", "dare_core"]
    proc = subprocess.run(
        [*launch, *args, f"output_dir={tmp_path}"], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _noise(stream: str, tmp_path) -> list[str]:
    """The lines of ``stream`` that look like a warning or a progress bar (paths under the test's
    directory, whose name says "warning", aside)."""
    lines = stream.replace(str(tmp_path), "RUN").replace("\r", "\n").splitlines()
    return [line for line in lines if NOISE.search(line)]


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--algo", "d1", "--model", "llada", *SHORT],
        ["train", "--algo", "sft", "--model", "llada", *SHORT],
        ["eval", "--model", "llada", "--tasks", "sudoku,countdown", "task.num_eval=4"],
    ],
    ids=["quick-start", "sft", "eval"],
)
def test_a_run_prints_no_warning(args, tmp_path):
    proc = _run(args, tmp_path)
    assert _noise(proc.stdout, tmp_path) == [] and _noise(proc.stderr, tmp_path) == []
    assert proc.stdout.strip().splitlines()[-1].startswith(("done: ", "wrote "))


@pytest.mark.parametrize("engine", ["engine.name=fsdp", "engine.name=deepspeed deepspeed.zero_stage=3"])
def test_a_two_rank_step_prints_no_warning(engine, tmp_path):
    """The ranks' own output included (FSDP2's view-tensor warning, DeepSpeed's accelerator
    warning, op build and deprecated collectives are fixed or silenced at their call sites)."""
    args = ["train", "--algo", "d1", "--model", "llada", *engine.split(), *SHORT, "eval.before=false"]
    proc = _run(args, tmp_path, ranks=2)
    assert _noise(proc.stdout, tmp_path) == [] and _noise(proc.stderr, tmp_path) == []
    assert proc.stdout.strip().splitlines()[-1].startswith("done: ")
