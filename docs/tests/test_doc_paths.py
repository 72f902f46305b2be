"""Every repository path the docs name exists: README.md, CONTRIBUTING.md, docs/ and every
distribution's README. A path is a backticked name that starts at a top-level folder of the
repository (``plugins/...``, ``docs/...``, ``tests/...``; in a distribution's README also at one of
its own folders, ``tests/...``, ``src/...``) or a link relative to the page."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOP = ("dare_core", "plugins", "libs", "docs", "tests", "scripts", "research", "contrib", ".ci")
#: a distribution's own folders, named from its README
OWN = ("src", "tests", "scripts", "checkpoints")
PAGES = sorted(
    {
        *REPO.glob("*.md"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("plugins/*/*/README.md"),
        *REPO.glob("plugins/README.md"),
        *REPO.glob("libs/*/README.md"),
        *REPO.glob("contrib/*/README.md"),
    }
)
CODE = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
#: placeholders a doc fills in (``runs/<run>``, ``dare_plugin_<id>``, ``{{name}}``, globs)
PLACEHOLDER = re.compile(r"[<>{}*]|\.\.\.|NAME|\bRUN\b|\bN\b")


def _named(page: pathlib.Path) -> list[tuple[str, list[pathlib.Path]]]:
    """``(as written, where it may be)`` of every repository path ``page`` names."""
    text = page.read_text()
    home = [page.parent] if page.parent != REPO and page.parent.name != "docs" else []  # a distribution's
    out = []
    for raw in CODE.findall(text):
        path = raw.split("::")[0].split(":")[0].rstrip(".,;")
        first = path.split("/")[0]
        if (first in TOP or (home and first in OWN)) and "/" in path.rstrip("/") and not PLACEHOLDER.search(path):
            out.append((raw, [root / path for root in (*home, REPO)]))
    for raw in LINK.findall(text):
        if re.match(r"[a-z]+:", raw) or PLACEHOLDER.search(raw):
            continue  # a URL
        out.append((raw, [(page.parent / raw).resolve()]))
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_path_a_page_names_exists(page):
    missing = [raw for raw, where in _named(page) if not any(p.exists() for p in where)]
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"
