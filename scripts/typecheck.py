"""Type-check the core, the libraries and the plugins that opt in, in one mypy run.

    python scripts/typecheck.py            # what `.ci/run` runs
    python scripts/typecheck.py --list     # the plugin source folders it adds, one a line

``python -m mypy`` alone checks the files of ``pyproject.toml``'s ``[tool.mypy]`` (``dare_core``
and every ``libs/*/src``). A plugin (under ``plugins/`` or ``contrib/``) opts in with

    [tool.dare]
    typecheck = true

in its own ``pyproject.toml``; this script adds its ``src/`` to the checked files and to mypy's
search path, with the root configuration's options.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy itself depends on tomli below 3.11
    import tomli as tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
PLUGIN_GLOBS = ("plugins/*/*/pyproject.toml", "contrib/*/pyproject.toml")


def opted_in(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
    """The ``src/`` folders of the plugins whose ``pyproject.toml`` sets ``[tool.dare] typecheck``.

    Args:
        repo: the repository root.

    Returns:
        The folders, relative to ``repo``, sorted.
    """
    found = []
    for glob in PLUGIN_GLOBS:
        for pyproject in sorted(repo.glob(glob)):
            with pyproject.open("rb") as f:
                dare = tomllib.load(f).get("tool", {}).get("dare", {})
            if dare.get("typecheck") is True:
                found.append(pyproject.parent.relative_to(repo) / "src")
    return found


def configured_files(repo: pathlib.Path = REPO) -> list[str]:
    """The ``files`` of the root ``pyproject.toml``'s ``[tool.mypy]`` (the core and the libraries)."""
    with (repo / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["tool"]["mypy"]["files"])


def main(argv: list[str]) -> int:
    plugins = [str(src) for src in opted_in()]
    if "--list" in argv:
        print("\n".join(plugins))
        return 0
    env = dict(os.environ)
    env["MYPYPATH"] = os.pathsep.join([*plugins, env.get("MYPYPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-m", "mypy", *configured_files(), *plugins]
    return subprocess.run(command, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
