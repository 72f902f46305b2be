"""The README states what the code does: its families x algorithms matrix is `dare list --matrix`
over this repository's own plugins, and the front page stays a front page."""

import importlib
import json
import pathlib
import re

import pytest

import dare_core.plugins as dare_plugins

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _first_party_plugins() -> list:
    """Every plugin module of plugins/ and libs/ (their ``dare`` entry points), imported by name."""
    modules = []
    for pyproject in sorted([*REPO.glob("plugins/*/*/pyproject.toml"), *REPO.glob("libs/*/pyproject.toml")]):
        text = pyproject.read_text()
        block = re.search(r"\[project\.entry-points\.dare\]\n(.*?)(\n\[|\Z)", text, re.S)
        if block:
            for name in re.findall(r'=\s*"([\w.]+)"', block.group(1)):
                modules.append(importlib.import_module(name))
    return modules


def _readme_matrix() -> list[dict[str, str]]:
    text = README.read_text()
    table = text.split("<!-- matrix:begin -->")[1].split("<!-- matrix:end -->")[0].strip().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    return [dict(zip(header, row)) for row in rows]


def _first_party_dare():
    return dare_plugins.build(load_entrypoints=False, extra_plugins=_first_party_plugins())


def test_readme_matrix_is_dare_list_matrix(dare_cli):
    result = dare_cli(_first_party_dare())("list", "--matrix", "--json")
    assert result.exit_code == 0, result.output
    assert _readme_matrix() == json.loads(result.output)


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert not re.search(r"\bsession\b|\u00a7|\bp = ", text, re.IGNORECASE)  # no history, section signs or p-values


@pytest.mark.parametrize(
    "command", ["train", "generate", "eval", "compare", "init", "bench", "plot", "plugins", "plugin", "list", "config"]
)
def test_readme_commands_exist(command, dare_cli):
    assert f"dare {command}" in README.read_text()
    assert dare_cli(_first_party_dare())(command, "--help").exit_code == 0


def test_set_up_installs_every_distribution_of_the_repository():
    listed = {
        line.split()[1].lstrip("./").split("[")[0].rstrip("/")
        for line in (REPO / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("-e ")
    }
    dirs = {
        str(p.parent.relative_to(REPO))
        for pattern in ("libs/*/pyproject.toml", "plugins/*/*/pyproject.toml", "contrib/*/pyproject.toml")
        for p in REPO.glob(pattern)
    }
    assert dirs <= listed, sorted(dirs - listed)


def test_evaluation_docs_fit_table_is_dare_list_fit(dare_cli):
    """docs/evaluation.md's task × bundled checkpoint table is ``dare list --fit``."""
    text = (REPO / "docs" / "evaluation.md").read_text()
    table = text.split("<!-- fit:begin -->")[1].split("<!-- fit:end -->")[0].strip().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    documented = [dict(zip(header, [c.strip() for c in line.strip("|").split("|")])) for line in table[2:]]
    result = dare_cli(_first_party_dare())("list", "--fit", "--json")
    assert result.exit_code == 0, result.output
    assert documented == json.loads(result.stdout)
