"""Registries for plugin tests: the plugins under test plus the DARE plugins their distributions
require — never whatever else happens to be installed.

A family plugin's distribution requires the rollout backends and tasks it defaults to; an
algorithm plugin's requires the shared objectives it composes and, in its ``test`` extra, the
samplers its toy runs use. :func:`build_for` registers those with the plugins under test, found
through the installed metadata (``Requires-Dist``, the ``test`` extra included) and the
requirements' ``dare`` entry points, so a plugin's tests list only the plugin itself.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re
from types import ModuleType
from typing import Any, Iterable, Mapping

from dare_core.plugins import ENTRY_POINT_GROUP, Dare, build

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=None)
def _required(dist: str) -> tuple[str, ...]:
    """Distributions ``dist`` requires unconditionally or in its ``test`` extra."""
    out = []
    for req in md.requires(dist) or ():
        name, _, marker = req.partition(";")
        if marker and not re.search(r"""extra\s*==\s*["']test["']""", marker):
            continue
        m = _NAME.match(name)
        if m:
            out.append(_canonical(m.group(1)))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[Mapping[str, list[str]], dict[str, md.EntryPoint]]:
    """``(top-level module -> distributions, distribution -> its dare entry point)``, read once
    per process (scanning the installed metadata takes a few hundred milliseconds)."""
    entry = {_canonical(ep.dist.name): ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.dist is not None}
    return md.packages_distributions(), entry


def requirements(plugins: Iterable[Any]) -> list[ModuleType]:
    """The ``dare`` entry-point modules of the distributions the given plugin modules'
    distributions require, recursively (the given plugins' own distributions excluded)."""
    owners, entry = _installed()
    own: set[str] = set()
    for plugin in plugins:
        top = getattr(plugin, "__name__", type(plugin).__module__).split(".")[0]
        own.update(_canonical(d) for d in owners.get(top, ()))
    seen, queue, found = set(own), [r for d in sorted(own) for r in _required(d)], []
    while queue:
        dist = queue.pop(0)
        if dist in seen:
            continue
        seen.add(dist)
        try:
            queue.extend(_required(dist))
        except md.PackageNotFoundError:
            continue
        if dist in entry:
            found.append(entry[dist].load())
    return found


def build_for(*plugins: Any, entrypoints: bool = False) -> Dare:
    """Registries of the core's default plugins, ``plugins`` and what they require (a plugin that
    fails to register raises)."""
    return build(load_entrypoints=entrypoints, extra_plugins=[*requirements(plugins), *plugins], strict=True)
