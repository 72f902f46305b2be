"""The core knows no model family and no algorithm by name (they reach it through hooks), the
trajectory algorithm plugins name no model family in any file (code, docs, packaging), and the
core imports none of the distributions built on it.

Family differences reach an algorithm only through the model wrapper and its capabilities, so a
family name in one of those packages is either a branch the design forbids or documentation that
has gone stale. The plugin check reads the source tree; it does not import or need the plugins
installed.
"""

import pathlib
import re

import pytest

import dare_core

NAMES = re.compile(
    r"llada|dream|sdar|grpo|bgpo|ebpo|mdpo|vrpo|\bespo\b|treerpo|\bspg\b|\bd1\b|diffucoder|fast.?dllm",
    re.IGNORECASE,
)
FAMILY = re.compile(r"llada|dream|sdar", re.IGNORECASE)  # the family plugins of this repo
ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERIC_ALGORITHM_PLUGINS = ["coupled-grpo", "cj-grpo", "mdpo", "justgrpo", "dtreerpo"]


def _lines_matching(root: pathlib.Path, pattern: re.Pattern, suffixes: set[str], shown_from: pathlib.Path) -> list[str]:
    """``path:line: text`` of every line under ``root`` (files with ``suffixes``, build metadata
    skipped) that ``pattern`` matches, paths shown relative to ``shown_from``."""
    offenders = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in suffixes or ".egg-info" in str(path) or "__pycache__" in str(path):
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(shown_from)}:{i}: {line.strip()}")
    return offenders


def test_core_sources_name_no_family_or_algorithm():
    root = pathlib.Path(dare_core.__file__).parent
    offenders = _lines_matching(root, NAMES, {".py", ".md", ".yaml", ".yml", ".txt", ".json", ".jinja", ".tmpl"}, root)
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("plugin", GENERIC_ALGORITHM_PLUGINS)
def test_algorithm_plugin_names_no_family(plugin):
    root = ROOT / "plugins" / "algorithms" / f"dare-plugin-{plugin}"
    if not root.is_dir():
        pytest.skip(f"{root} is not part of this checkout")
    offenders = _lines_matching(root, FAMILY, {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".json"}, ROOT)
    assert not offenders, "\n".join(offenders)


def test_core_imports_no_distribution_built_on_it():
    """No task, sampler, benchmark, plot, tracking, nn-toolkit or objective module: the core
    reaches them only through hooks."""
    root = pathlib.Path(dare_core.__file__).parent
    pattern = re.compile(r"^\s*(import|from)\s+(dare_plugin_\w+|dare_nn|dare_objectives)\b")
    offenders = _lines_matching(root, pattern, {".py"}, root)
    assert not offenders, "\n".join(offenders)


def test_core_tests_import_no_family_or_algorithm_plugin():
    """The core's tests name the plugins they register; besides test-only plugins that is only
    the reference samplers and tasks, which a loop and the default config need."""
    tests = pathlib.Path(__file__).parent
    pattern = re.compile(r"^\s*(import|from)\s+dare_plugin_(?!samplers\b|tasks\b)", re.MULTILINE)
    offenders = [str(p) for p in tests.rglob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders
