"""The commands of the docs, as written: every ``dare`` command in a code block of README.md,
CONTRIBUTING.md, docs/ and the distributions' READMEs parses with the CLI as installed (its
subcommand, options and their values) and its ``key=value`` overrides resolve into a run config;
every research script's flags are flags it accepts. The fast commands run as written in the
default suite (:data:`RUN`); the README's first run is a slow test (``-m slow``).

A placeholder the reader fills in (``RUN``, ``DIR``, ``<run>``, ``S``, ``...``) stands for a value
of their own: the command is parsed and resolved with a stand-in value. Commands that need a GPU,
the network or a published checkpoint parse here like the others; they run only where those are.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys
import warnings

import click
import pytest

from dare_core.cli import cli
from dare_core.config import resolve
from dare_core.plugins import get_dare

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted(
    {
        *REPO.glob("*.md"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("plugins/*/*/README.md"),
        *REPO.glob("libs/*/README.md"),
        *REPO.glob("contrib/*/README.md"),
    }
)
BLOCK = re.compile(r"```(?:bash|sh|console|shell)?\n(.*?)```", re.S)
#: the reader's placeholders and what the test puts in their place
STAND_INS = [
    (re.compile(r'"\.\.\."'), '"text"'),  # a prompt of the reader's
    (re.compile(r"\{(\w+),[\w,]+\}"), r"\1"),  # one of several choices: the first
    (re.compile(r"\[--\w+ \w+\]"), ""),  # an optional flag in a synopsis
    (re.compile(r"--model (F|<family>|<masked family>)(?=\s|$)"), "--model llada"),
    (re.compile(r"--model <block family>(?=\s|$)"), "--model sdar"),
    (re.compile(r"--algo (ALGO|<algo>)(?=\s|$)"), "--algo d1"),
    # a checkpoint or adapter of the reader's (a run's, a published one): the bundled checkpoint
    (re.compile(r"\s(model\.path|model\.lora\.adapter)=(\S*(<|RUN|DIR|DG|/ckpt/|/path/)\S*)"), ""),
]
#: placeholders inside a value (``RUN_S0/final``, ``$HEAD:29500``, ``seed=S``)
INNER = re.compile(r"<[^>]+>|\bRUN\w*|\$\{?\w+\}?|\bDIR\b|\bCKPT\b|\bCACHE\b")
NUMBER = re.compile(r"^(S|N|K)$")


def _commands(page: pathlib.Path) -> list[tuple[int, str, str]]:
    """``(line, command, comment)`` of every shell command in ``page``'s code blocks: ``$ ``
    lines of a console block or lines that start with a command word, backslash continuations
    joined, the trailing comment apart."""
    text = page.read_text()
    out = []
    for match in BLOCK.finditer(text):
        first = text[: match.start()].count("\n") + 2
        lines = match.group(1).splitlines()
        i = 0
        while i < len(lines):
            start, line = i, lines[i].strip()
            line = line[2:] if line.startswith("$ ") else line
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            if re.match(r"(dare|torchrun|srun torchrun|python) ", line):
                comment = re.search(r"\s+#\s.*$", line)
                out.append((first + start, line[: comment.start()] if comment else line, comment[0] if comment else ""))
    return out


COMMANDS = [(page, line, cmd, comment) for page in PAGES for line, cmd, comment in _commands(page)]
DOCUMENTED = [(page, line, cmd) for page, line, cmd, _ in COMMANDS]
#: what a command needs that a CPU machine without a network lacks: its line in the doc says so
#: with a ``# needs: ...`` comment (GPUs, nodes, a published checkpoint)
NEEDS = re.compile(
    r"model\.device=cuda|/ckpt/|--nproc_per_node[= ]([3-9]|\d\d)|--nnodes|^srun |(rollout|eval)\.backend=(vllm|sglang)"
)


def _ids() -> list[str]:
    return [f"{page.relative_to(REPO)}:{line}" for page, line, _ in DOCUMENTED]


def _dare_args(cmd: str) -> list[str] | None:
    """The arguments after ``dare`` (or ``-m dare_core`` under torchrun) of ``cmd`` with the
    reader's placeholders stood in for, up to a pipe; None for another program's command or one
    abbreviated with ``...`` (it repeats the command above it)."""
    for pattern, stand_in in STAND_INS:
        cmd = pattern.sub(stand_in, cmd)
    words = shlex.split(cmd, comments=True)
    words = words[: words.index("|")] if "|" in words else words
    if "..." in words:
        return None
    if words[0] == "dare":
        args = words[1:]
    elif "-m" in words and "dare_core" in words and words[words.index("dare_core") - 1] == "-m":
        args = words[words.index("dare_core") + 1 :]
    else:
        return None
    return [_stand_in(w) for w in args]


def _stand_in(word: str) -> str:
    """``word`` with a placeholder inside replaced by a value of the right shape."""
    key, sep, value = word.partition("=")
    if sep and NUMBER.match(value):
        return f"{key}=0"
    return INNER.sub("x", word)


def _parse(args: list[str]) -> tuple[str, dict]:
    """The command path (``config show``) and its parameters as the CLI parses ``args`` (a
    click UsageError on a bad subcommand, option or value)."""
    with warnings.catch_warnings():  # click 8.2 deprecates protected_args, the way to read a group's rest
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = cli.make_context("dare", list(args), resilient_parsing=False)
        group, rest, names = cli, ctx.protected_args + ctx.args, []
        while True:
            name, command, rest = group.resolve_command(ctx, rest)
            names.append(name)
            ctx = command.make_context(name, rest, parent=ctx)
            if not isinstance(command, click.Group):
                return " ".join(names), ctx.params
            group, rest = command, ctx.protected_args + ctx.args


@pytest.mark.parametrize(("page", "line", "cmd"), DOCUMENTED, ids=_ids())
def test_a_documented_command_parses_and_resolves(page, line, cmd, monkeypatch):
    """The command's subcommand and options exist, their values parse, and its overrides (with
    the algorithm, model and config file it names) resolve into a run config."""
    args = _dare_args(cmd)
    if args is None:
        _check_script(cmd)
        return
    monkeypatch.chdir(REPO)  # the docs name config files relative to the repository
    try:
        path, params = _parse(args)
    except click.exceptions.Exit:  # --help
        return
    overrides = [o for o in params.get("overrides", ()) if "=" in o]
    if path not in ("train", "eval", "generate", "compare", "config show"):
        return
    config_file = params.get("config_file")
    if config_file and not os.path.isfile(config_file):
        config_file = None  # a run's own config.yaml (RUN/config.yaml)
    algo = params.get("algo")
    resolve(
        get_dare(),
        algo=algo,
        model=params.get("model"),
        config_file=config_file,
        overrides=overrides,
        need_algo=bool(algo),
    )


def _check_script(cmd: str) -> None:
    """A repository script's documented flags are flags its ``--help`` lists."""
    words = shlex.split(cmd)
    script = next((w for w in words if w.endswith(".py") and (REPO / w).is_file()), None)
    if script is None:
        return  # a module of another project (lm-eval's CLI) or a tool's own command
    shown = _script_help(script)
    flags = {w.split("=")[0] for w in words if w.startswith("--")}
    unknown = sorted(f for f in flags if f not in shown)
    assert not unknown, f"{script} --help does not list {unknown}"


@functools.lru_cache(maxsize=None)
def _script_help(script: str) -> str:
    """``python SCRIPT --help``'s output, run once per script (several commands name one)."""
    shown = subprocess.run(
        [sys.executable, str(REPO / script), "--help"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    return shown.stdout


#: documented commands that run as written in the default suite (each under a minute here),
#: with a line their output must hold where the doc shows none
RUN = {
    "dare plugins": "distribution",
    "dare list --matrix": "algorithm",
    "dare list models": "llada",
    "dare list engines": "single",
    "dare plot --help": "Usage: dare plot",
    'dare generate --model llada2 --prompt "Solve the following Sudoku puzzle: 3102200002100320"': "",
    'dare generate --model sdar --prompt "Solve the 4x4 Sudoku 1030020000040001"': "",
    "dare eval --model llada --tasks sudoku,countdown --samples 4 --k 1,4 eval.temperature=1.0 task.num_eval=20": "",
}
#: documented commands that run as written under ``-m slow`` (minutes each)
SLOW = {
    "dare train --algo d1 --model llada": "eval after: accuracy=",
    "dare eval --model llada --tasks sudoku,countdown": "sudoku",
}


def _shown(cmd: str) -> list[str]:
    """The output a page shows under ``$ cmd`` in a console block (empty where it shows none)."""
    for page in PAGES:
        text = page.read_text()
        at = text.find(f"$ {cmd}\n")
        if at >= 0:
            block = text[at:].split("```")[0].splitlines()[1:]
            return [line for line in block if line.strip()]
    return []


def _comparable(lines: list[str]) -> list[str]:
    """Output lines with what changes from run to run aside: the ``seconds`` column (the last
    number of a table row) and the directory after ``wrote``."""
    out = []
    for line in lines:
        line = re.sub(r"^wrote .*", "wrote DIR", line.rstrip())
        out.append(re.sub(r"\s\d+\.\d+$", " S", line) if not line.startswith("task") else line)
    return out


def _run_as_written(cmd: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "dare_core", *shlex.split(cmd)[1:]],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def test_a_command_that_needs_gpus_or_a_published_checkpoint_says_so():
    """A documented command that cannot run on a CPU machine offline (CUDA, several GPUs or
    nodes, a checkpoint downloaded by the reader, a GPU rollout engine) is marked ``# needs:``
    on its line; the others parse, resolve and (:data:`RUN`, :data:`SLOW`) run here."""
    unmarked = [
        f"{page.relative_to(REPO)}:{line}: {cmd[:80]}"
        for page, line, cmd, comment in COMMANDS
        if NEEDS.search(cmd) and "# needs:" not in comment
    ]
    assert not unmarked, "mark these `# needs: ...`:\n" + "\n".join(unmarked)
    assert not any(NEEDS.search(cmd) for cmd in (*RUN, *SLOW))


def test_the_run_commands_are_documented():
    documented = {cmd for _, _, cmd in DOCUMENTED}
    assert sorted((set(RUN) | set(SLOW)) - documented) == [], "a command of RUN or SLOW is not in the docs"


@pytest.mark.parametrize("cmd", sorted(RUN))
def test_a_fast_command_runs_as_written(cmd, tmp_path):
    """Exit status 0; the output the doc shows (but the timings and the directory written), or
    the line :data:`RUN` names."""
    proc = _run_as_written(cmd, tmp_path)
    shown = _shown(cmd)
    if shown:
        assert _comparable(proc.stdout.splitlines()) == _comparable(shown)
    assert RUN[cmd] in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", sorted(SLOW))
def test_a_slow_command_runs_as_written(cmd, tmp_path):
    proc = _run_as_written(cmd, tmp_path)
    assert SLOW[cmd] in proc.stdout + proc.stderr, proc.stderr[-3000:]
