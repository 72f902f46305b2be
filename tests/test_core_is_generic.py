"""The core knows no model family and no algorithm by name (they reach it through hooks)."""

import pathlib
import re

import dare_core

NAMES = re.compile(
    r"llada|dream|sdar|grpo|bgpo|ebpo|mdpo|vrpo|\bespo\b|treerpo|\bspg\b|\bd1\b|diffucoder|fast.?dllm",
    re.IGNORECASE,
)


def test_core_sources_name_no_family_or_algorithm():
    root = pathlib.Path(dare_core.__file__).parent
    offenders = []
    for path in root.rglob("*"):
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".txt", ".json", ".jinja"}:
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if NAMES.search(line):
                offenders.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_core_tests_do_not_import_plugins():
    tests = pathlib.Path(__file__).parent
    pattern = re.compile(r"^\s*(import|from)\s+dare_plugin_", re.MULTILINE)
    offenders = [str(p) for p in tests.rglob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders
