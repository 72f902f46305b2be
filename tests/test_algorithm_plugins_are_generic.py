"""Issue 4's algorithm plugins name no model family in any file (code, docs, packaging).

Family differences reach an algorithm only through the model wrapper and its capabilities, so a
family name in one of these packages is either a branch the design forbids or documentation that
has gone stale. The check reads the source tree; it does not import or need the plugins installed.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGINS = ["coupled-grpo", "cj-grpo", "mdpo", "justgrpo", "dtreerpo"]
FAMILY = re.compile(r"llada|dream|sdar", re.IGNORECASE)  # the family plugins of this repo
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".json"}


@pytest.mark.parametrize("plugin", PLUGINS)
def test_algorithm_plugin_names_no_family(plugin):
    root = ROOT / "plugins" / f"dare-plugin-{plugin}"
    if not root.is_dir():
        pytest.skip(f"{root} is not part of this checkout")
    offenders = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in SUFFIXES or ".egg-info" in str(path) or "__pycache__" in str(path):
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FAMILY.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
