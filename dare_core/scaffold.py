"""``dare plugin new KIND NAME``: a plugin distribution written from a template.

The templates are package data under ``dare_core/templates/plugin/``: ``_common/`` holds the files
every kind gets, ``<kind>/`` the kind's own (a file there replaces a ``_common`` one of the same
path). Every template file ends in ``.tmpl`` (dropped on output), and in paths and contents
``{{name}}`` becomes the registered name (``my_algo``), ``{{dist}}`` the distribution name
(``dare-plugin-my-algo``) and ``{{Name}}`` the name in CamelCase (``MyAlgo``); the package is
``dare_plugin_{{name}}``. The distribution is written to a temporary directory beside the target
and renamed into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from typing import Optional

from dare_core.errors import DareError

TEMPLATES = pathlib.Path(__file__).parent / "templates" / "plugin"
#: the kinds of plugin ``dare plugin new`` writes (a directory of templates each)
KINDS = ("algorithm", "engine", "family", "rollout", "task")
SUFFIX = ".tmpl"
_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def placeholders(name: str) -> dict[str, str]:
    """The template placeholders and their values for plugin ``name``.

    Args:
        name: the registered name (lower case, digits, single underscores).

    Returns:
        ``{"{{name}}": name, "{{dist}}": "dare-plugin-<name with - for _>", "{{Name}}": CamelCase}``.
    """
    return {
        "{{name}}": name,
        "{{dist}}": "dare-plugin-" + name.replace("_", "-"),
        "{{Name}}": "".join(part.capitalize() for part in name.split("_")),
    }


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def render(kind: str, name: str) -> dict[str, str]:
    """The files of a new ``kind`` plugin called ``name``.

    Args:
        kind: one of :data:`KINDS`.
        name: the registered name; checked by :func:`check_name`.

    Returns:
        relative path (``/``-separated) -> file text, sorted by path.
    """
    check_name(name)
    if kind not in KINDS:
        raise DareError(f"unknown plugin kind {kind!r}; choose one of {', '.join(KINDS)}")
    values, files = placeholders(name), {}
    for root in (TEMPLATES / "_common", TEMPLATES / kind):
        for path in root.rglob("*" + SUFFIX):
            rel = path.relative_to(root).as_posix()[: -len(SUFFIX)]
            files[_fill(rel, values)] = _fill(path.read_text(encoding="utf-8"), values)
    return dict(sorted(files.items()))


def check_name(name: str) -> None:
    """Refuse a name that is not lower-case letters and digits joined by single underscores."""
    if not _NAME.fullmatch(name):
        raise DareError(
            f"plugin name {name!r} is not lower-case letters and digits joined by single underscores, "
            "starting with a letter; choose one such as my_plugin"
        )


def new_plugin(kind: str, name: str, out_dir: Optional[str] = None) -> pathlib.Path:
    """Write the distribution of a new ``kind`` plugin ``name`` and return its directory.

    Args:
        kind: one of :data:`KINDS`.
        name: the registered name; the package is ``dare_plugin_<name>``.
        out_dir: the distribution's directory (default ``./dare-plugin-<name with - for _>``);
            it must not exist.

    Returns:
        The directory written.
    """
    files = render(kind, name)
    target = pathlib.Path(out_dir or placeholders(name)["{{dist}}"]).absolute()
    if target.exists() or target.is_symlink():
        raise DareError(f"{target} already exists; remove it or pass another --dir")
    tmp, made = target.parent / f".{target.name}.{os.getpid()}.partial", False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        made = True
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text, encoding="utf-8")
        os.rename(tmp, target)
    except OSError as exc:
        raise DareError(
            f"cannot write {target}: {exc.strerror or exc}; check the directory and its permissions"
        ) from exc
    finally:
        if made and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
