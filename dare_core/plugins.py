"""Plugin manager: entry-point discovery, load control, registration and listing.

Plugins are distributions declaring ``[project.entry-points.dare] <id> = "<module>"``. Loading is
controlled by two environment variables (comma-separated plugin ids):

* ``DARE_PLUGINS`` — load only these entry-point plugins (``none`` loads none). Unset: all.
* ``DARE_DISABLE_PLUGINS`` — never load these (applied after ``DARE_PLUGINS``).

The core's own default plugin (the generic components) is always registered; they are
named ``dare_core.*`` in listings.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
from types import ModuleType
from typing import Any, Callable, Iterable, Optional

import attrs
import pluggy

from dare_core import hookspecs
from dare_core.errors import DareError
from dare_core.registry import Registries

hookimpl = pluggy.HookimplMarker("dare")

ENTRY_POINT_GROUP = "dare"

DEFAULT_PLUGINS = ("dare_core.default_plugins.components",)

# hook name -> registry attribute filled by it
REGISTRATION_HOOKS = {
    "dare_register_model_wrappers": "models",
    "dare_register_corruptions": "corruptions",
    "dare_register_trajectory_builders": "trajectories",
    "dare_register_likelihood_estimators": "estimators",
    "dare_register_policy_losses": "losses",
    "dare_register_advantage_estimators": "advantages",
    "dare_register_rollout_backends": "rollouts",
    "dare_register_algorithms": "algorithms",
    "dare_register_tasks": "tasks",
    "dare_register_config_sections": "config_sections",
    "dare_register_engines": "engines",
    "dare_register_workflows": "workflows",
}


@attrs.frozen
class PluginInfo:
    name: str
    distribution: str
    version: str
    module: str
    hooks: tuple[str, ...]
    builtin: bool

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _env_list(name: str) -> Optional[set[str]]:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _selected_entry_points() -> list[md.EntryPoint]:
    allow = _env_list("DARE_PLUGINS")
    deny = _env_list("DARE_DISABLE_PLUGINS") or set()
    eps = sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    out = []
    seen: set[str] = set()
    for ep in eps:
        if ep.name in seen:
            continue
        seen.add(ep.name)
        if allow is not None and ("none" in allow or ep.name not in allow):
            continue
        if ep.name in deny:
            continue
        out.append(ep)
    return out


class Dare:
    """The plugin manager plus the registries filled from it."""

    def __init__(self, pm: pluggy.PluginManager, registries: Registries,
                 infos: list[PluginInfo]):
        self.pm = pm
        self.registries = registries
        self.infos = infos

    def plugin_infos(self) -> list[PluginInfo]:
        return list(self.infos)


def _make_pm() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("dare")
    pm.add_hookspecs(hookspecs)
    return pm


def build(
    *,
    load_entrypoints: bool = True,
    extra_plugins: Iterable[ModuleType | Any] = (),
    default_plugins: bool = True,
) -> Dare:
    """Build a plugin manager and fill fresh registries from it.

    :param load_entrypoints: load the installed ``dare`` entry points (subject to the
        ``DARE_PLUGINS``/``DARE_DISABLE_PLUGINS`` variables).
    :param extra_plugins: more plugin objects/modules to register (tests use this).
    :param default_plugins: register the core's generic components.
    """
    pm = _make_pm()
    infos: list[PluginInfo] = []
    if default_plugins:
        for modname in DEFAULT_PLUGINS:
            mod = importlib.import_module(modname)
            pm.register(mod, name=modname)
            infos.append(_info(pm, modname, "dare-core", _core_version(), modname, True))
    if load_entrypoints:
        for ep in _selected_entry_points():
            try:
                mod = ep.load()
            except Exception as exc:  # a broken plugin must not hide the others' errors
                reason = " ".join(str(exc).split())  # one line, even for multi-line messages
                raise DareError(
                    f"plugin {ep.name!r} ({ep.value}) failed to import: "
                    f"{type(exc).__name__}: {reason}; reinstall it or disable it with "
                    f"DARE_DISABLE_PLUGINS={ep.name}"
                ) from exc
            pm.register(mod, name=ep.name)
            dist = ep.dist.name if ep.dist is not None else "?"
            ver = ep.dist.version if ep.dist is not None else "?"
            infos.append(_info(pm, ep.name, dist, ver, ep.value, False))
    for i, plugin in enumerate(extra_plugins):
        name = getattr(plugin, "__name__", None) or f"extra-{i}"
        pm.register(plugin, name=name)
        infos.append(_info(pm, name, "-", "-", name, False))
    pm.hook.dare_addhooks.call_historic(kwargs={"pluginmanager": pm})
    registries = Registries()
    for hook_name, attr in REGISTRATION_HOOKS.items():
        registry = registries[attr]
        caller = getattr(pm.hook, hook_name)
        # get_hookimpls() lists implementations in registration order (pluggy *calls* them in
        # reverse); register in that order so the first plugin to claim a name owns it and a
        # duplicate error names the later plugin as the one to disable.
        for impl in caller.get_hookimpls():
            impl.function(register=_registrar(registry, impl.plugin_name))
    return Dare(pm, registries, infos)


def _registrar(registry, owner: str) -> Callable[[Any], None]:
    def register(spec: Any) -> None:
        name = getattr(spec, "name", None)
        if not name:
            raise TypeError(f"plugin {owner!r} registered a {registry.kind} without a name")
        registry.register(name, spec, owner=owner)

    return register


def _core_version() -> str:
    from dare_core._version import __version__

    return __version__


def _info(pm: pluggy.PluginManager, name: str, dist: str, version: str, module: str,
          builtin: bool) -> PluginInfo:
    plugin = pm.get_plugin(name)
    hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or []))
    return PluginInfo(name, dist, version, module, hooks, builtin)


_DARE: Optional[Dare] = None


def get_dare() -> Dare:
    """The process-wide :class:`Dare`, built on first use from the installed plugins."""
    global _DARE
    if _DARE is None:
        _DARE = build()
    return _DARE


def reset() -> None:
    """Forget the process-wide :class:`Dare` (tests; after installing a plugin)."""
    global _DARE
    _DARE = None
