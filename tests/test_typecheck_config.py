"""The type checker's configuration covers the core, every library and the plugins that opt in.

mypy itself runs in `.ci/run` (``scripts/typecheck.py``), not here: these tests check what it is
pointed at, so a new library under ``libs/`` cannot be left out of it.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
LIBRARY_SOURCES = sorted(str(p.relative_to(REPO)) for p in REPO.glob("libs/*/src"))


def _typecheck_script():
    spec = importlib.util.spec_from_file_location("typecheck", REPO / "scripts" / "typecheck.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("typecheck", module)
    spec.loader.exec_module(module)
    return module


def _mypy_config() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["mypy"]


def test_the_core_and_every_library_are_checked():
    config = _mypy_config()
    assert LIBRARY_SOURCES, "no libs/*/src found"
    missing = [path for path in ["dare_core", *LIBRARY_SOURCES] if path not in config["files"]]
    assert not missing, f"add {missing} to [tool.mypy] files in pyproject.toml"
    # the libraries are namespace packages: mypy resolves them through mypy_path
    missing = [path for path in LIBRARY_SOURCES if path not in config["mypy_path"]]
    assert not missing, f"add {missing} to [tool.mypy] mypy_path in pyproject.toml"
    assert config["explicit_package_bases"] is True
    assert config["warn_unused_ignores"] is True
    assert config.get("strict") is not True and config.get("ignore_missing_imports") is not True


def test_the_script_checks_the_configured_files_and_the_plugins_that_opt_in(tmp_path):
    script = _typecheck_script()
    assert script.configured_files() == _mypy_config()["files"]
    opted = script.opted_in()
    assert pathlib.Path("plugins/integrations/dare-plugin-tracking/src") in opted
    assert all((REPO / src).is_dir() for src in opted), opted
    # a plugin without the flag, or with it false, is not added
    for name, flag in [("dare-plugin-on", "true"), ("dare-plugin-off", "false"), ("dare-plugin-none", None)]:
        dist = tmp_path / "plugins" / "algorithms" / name
        dist.mkdir(parents=True)
        text = '[project]\nname = "x"\n' + (f"\n[tool.dare]\ntypecheck = {flag}\n" if flag else "")
        (dist / "pyproject.toml").write_text(text)
    assert script.opted_in(tmp_path) == [pathlib.Path("plugins/algorithms/dare-plugin-on/src")]


def test_every_type_ignore_names_its_error_code():
    bare = re.compile(r"#\s*type:\s*ignore(?!\[)")
    roots = [REPO / "dare_core", *(REPO / src for src in LIBRARY_SOURCES)]
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert not found, f"name the error code in each `# type: ignore[code]`: {found}"
