"""``dare plugin new``: every kind's distribution passes its own tests right after generation (one
pytest process over all five, not installed), builds as a wheel, uses the public API only and
names no family or algorithm; the algorithm template in ``contrib/`` is its output; bad names,
kinds and existing directories are one-line errors, and a failed write leaves nothing."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest
from click.testing import CliRunner

from dare_core.cli import cli
from dare_core.scaffold import KINDS, render

REPO = pathlib.Path(__file__).resolve().parents[2]
#: the name each kind is generated with (no distribution of this repository uses them)
NAMES = {kind: f"made_{kind}" for kind in KINDS}
#: the contract's cases that cannot run on this machine or for this template (no GPU; the family
#: template declares no packed attention)
ALLOWED_SKIPS = ("needs a CUDA device", "does not pack sequences")


def _new(*args: str):
    return CliRunner().invoke(cli, ["plugin", "new", *args], prog_name="dare")


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("plugins")
    for kind, name in NAMES.items():
        result = _new(kind, name, "--dir", str(root / kind))
        assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def outcomes(generated) -> dict[str, list[str]]:
    """Each kind's ``PASSED ...`` / ``FAILED ...`` lines and the run's skip reasons (``-rA``)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rA",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        "--rootdir=.",
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the generated conftests put src/ on sys.path
    run = subprocess.run(
        [*cmd, *(f"{kind}/tests" for kind in KINDS)],
        cwd=generated,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    out = {kind: [line for line in lines if re.match(rf"(PASSED|FAILED|ERROR) {kind}/tests/", line)] for kind in KINDS}
    out["skipped"] = [line for line in lines if line.startswith("SKIPPED")]
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_the_generated_plugin_passes_its_tests(outcomes, kind):
    assert len(outcomes[kind]) >= 4, outcomes[kind]
    assert all(line.startswith("PASSED") for line in outcomes[kind]), outcomes[kind]


def test_only_the_contract_s_machine_cases_skip(outcomes):
    assert all(any(reason in line for reason in ALLOWED_SKIPS) for line in outcomes["skipped"]), outcomes["skipped"]


def test_the_generated_distributions_build_as_wheels(generated, tmp_path):
    dirs = [str(generated / kind) for kind in KINDS]
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    build = subprocess.run([*cmd, *dirs], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    for name in NAMES.values():
        (wheel,) = tmp_path.glob(f"dare_plugin_{name}-0.1.0-*.whl")
        files = zipfile.ZipFile(wheel).namelist()
        entry = next(f for f in files if f.endswith(".dist-info/entry_points.txt"))
        assert f"[dare]\n{name} = dare_plugin_{name}\n" in zipfile.ZipFile(wheel).read(entry).decode()
        assert f"dare_plugin_{name}/__init__.py" in files
    task = zipfile.ZipFile(next(tmp_path.glob("dare_plugin_made_task-*.whl"))).namelist()
    assert {"dare_plugin_made_task/data/train.jsonl", "dare_plugin_made_task/data/eval.jsonl"} <= set(task)


def _generic_names() -> re.Pattern:
    spec = importlib.util.spec_from_file_location("core_is_generic", REPO / "tests" / "test_core_is_generic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NAMES


@pytest.mark.parametrize("kind", KINDS)
def test_the_templates_use_the_public_api_and_name_no_family_or_algorithm(kind):
    allowed = re.compile(r"^\s*(from|import)\s+dare_core(\.api|\.testing[\w.]*)?\b(?!\.)")
    names = _generic_names()
    for rel, text in render(kind, "x").items():
        core = [line for line in text.splitlines() if re.match(r"^\s*(from|import)\s+dare_core", line)]
        assert all(allowed.match(line) for line in core), f"{kind}/{rel} imports a private dare_core module"
        assert not names.search(text), f"{kind}/{rel}: {names.search(text).group(0)}"
        assert "{{" not in rel and not re.search(r"\{\{(name|Name|dist)\}\}", text), f"{kind}/{rel}"


def test_contrib_template_is_the_algorithm_output(tmp_path):
    """``contrib/dare-plugin-template`` is ``dare plugin new algorithm myalgo``, byte for byte."""
    assert _new("algorithm", "myalgo", "--dir", str(tmp_path / "out")).exit_code == 0
    contrib = REPO / "contrib" / "dare-plugin-template"

    def files(root: pathlib.Path) -> dict[str, bytes]:
        skip = re.compile(r"\.egg-info|__pycache__|\.pytest_cache|^build/")
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and not skip.search(p.relative_to(root).as_posix())
        }

    want, got = files(contrib), files(tmp_path / "out")
    assert sorted(want) == sorted(got)
    assert [rel for rel in want if want[rel] != got[rel]] == []


def test_the_default_directory_and_its_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _new("task", "two_words")
    assert result.exit_code == 0, result.output
    root = tmp_path / "dare-plugin-two-words"
    assert str(root) in result.output
    text = (root / "pyproject.toml").read_text()
    assert 'name = "dare-plugin-two-words"' in text and 'two_words = "dare_plugin_two_words"' in text
    assert "class TwoWordsTask" in (root / "src" / "dare_plugin_two_words" / "task.py").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["dare-plugin-two-words"]


@pytest.mark.parametrize("name", ["MyAlgo", "9lives", "my-algo", "my__algo", "algo_", "_algo", "ünï", "a b"])
def test_a_bad_name_is_one_line(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "is not lower-case letters and digits" in _one_error_line(_new("algorithm", name))
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_kind_is_one_line(tmp_path):
    line = _one_error_line(_new("workflow", "x", "--dir", str(tmp_path / "x")))
    assert "'workflow' is not one of" in line and not (tmp_path / "x").exists()


def test_an_existing_directory_is_one_line_and_untouched(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert "already exists" in _one_error_line(_new("engine", "mine", "--dir", str(target)))
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert "already exists" in _one_error_line(_new("engine", "mine", "--dir", str(tmp_path / "empty")))


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    written = []
    real = pathlib.Path.write_text

    def fail_third(self, *args, **kwargs):
        written.append(self)
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", fail_third)
    line = _one_error_line(_new("rollout", "mine", "--dir", str(tmp_path / "mine")))
    assert "No space left on device" in line
    assert list(tmp_path.iterdir()) == []
