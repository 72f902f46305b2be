"""Plugin manager: entry-point discovery, load control, isolation, registration and listing.

Plugins are distributions declaring ``[project.entry-points.dare] <id> = "<module>"``. Loading is
controlled by two environment variables (comma-separated plugin ids; an id that is not installed
is an error):

* ``DARE_PLUGINS`` — load only these entry-point plugins (``none`` loads none). Unset: all.
* ``DARE_DISABLE_PLUGINS`` — never load these (applied after ``DARE_PLUGINS``).

A plugin that fails to import or whose registration hook raises is *broken*: it is recorded with
a one-line reason, unregistered and what it registered is dropped; the others load
(``build(strict=True)`` raises instead). The core's own default plugin (the generic components)
is always registered; they are named ``dare_core.*`` in listings.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import os
from types import ModuleType
from typing import Any, Callable, Iterable, Optional

import attrs
import pluggy

from dare_core import hookspecs
from dare_core._version import __version__
from dare_core.errors import DareError, DuplicateNameError
from dare_core.registry import Registries

hookimpl = pluggy.HookimplMarker("dare")

ENTRY_POINT_GROUP = "dare"

DEFAULT_PLUGINS = ("dare_core.default_plugins.components",)

#: the keyword of an example distribution's metadata (``dare list`` marks what it registers)
EXAMPLE_KEYWORD = "dare-example"

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


class lazy:
    """A callable standing for ``"package.module:attr"`` (``attr`` may be dotted) that imports its
    target on first call, so a plugin registers a spec (``build=lazy("pkg.algorithm:build")``)
    without importing its implementation. A missing target is a one-line :class:`DareError`."""

    __slots__ = ("target", "_obj")

    def __init__(self, target: str):
        if target.count(":") != 1 or not all(target.split(":")):
            raise ValueError(f"lazy target must be 'package.module:attr', got {target!r}")
        self.target = target
        self._obj: Any = None  # the target, whatever object it names, once imported

    def resolve(self) -> Any:
        if self._obj is None:
            module, attr = self.target.split(":")
            try:
                obj = importlib.import_module(module)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as exc:
                raise DareError(
                    f"cannot load {self.target!r}: {one_line(exc)}; reinstall the plugin that registers it"
                ) from exc
            self._obj = obj
        return self._obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy({self.target!r})"


@attrs.frozen
class PluginInfo:
    name: str
    distribution: str
    version: str
    module: str
    hooks: tuple[str, ...]
    builtin: bool
    #: why the plugin was skipped (one line); empty when it loaded
    broken: str = ""
    #: an example distribution (its metadata's keywords hold ``dare-example``): listed as such
    example: bool = False

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def broken_message(self) -> str:
        return (
            f"plugin {self.name!r} ({self.distribution}) is broken: {self.broken}; reinstall it "
            f"or disable it with DARE_DISABLE_PLUGINS={self.name}"
        )


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())


def _env_list(name: str, installed: list[str]) -> Optional[set[str]]:
    raw = os.environ.get(name)
    if raw is None:
        return None
    ids = {p.strip() for p in raw.split(",") if p.strip()}
    for unknown in sorted(ids - set(installed) - {"none"}):
        close = difflib.get_close_matches(unknown, installed, n=1, cutoff=0.5)
        raise DareError(
            f"{name} names {unknown!r}, which is not an installed plugin; installed: "
            + (", ".join(installed) or "none")
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    return ids


def _selected_entry_points() -> list[md.EntryPoint]:
    eps: dict[str, md.EntryPoint] = {}
    for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        eps.setdefault(ep.name, ep)
    allow = _env_list("DARE_PLUGINS", list(eps))
    deny = _env_list("DARE_DISABLE_PLUGINS", list(eps)) or set()
    return [
        ep
        for name, ep in eps.items()
        if (allow is None or ("none" not in allow and name in allow)) and name not in deny
    ]


class Dare:
    """The plugin manager plus the registries filled from it."""

    def __init__(self, pm: pluggy.PluginManager, registries: Registries, infos: list[PluginInfo]):
        self.pm, self.registries, self.infos = pm, registries, infos

    def plugin_infos(self) -> list[PluginInfo]:
        return list(self.infos)

    def examples(self) -> set[str]:
        """The ids of the plugins whose distribution is an example (:data:`EXAMPLE_KEYWORD`)."""
        return {i.name for i in self.infos if i.example}

    def broken(self) -> list[PluginInfo]:
        """The plugins skipped because they failed to import or to register."""
        return [i for i in self.infos if i.broken]

    def disable(self, name: str, reason: str) -> None:
        """Record plugin ``name`` as broken for ``reason`` (one line): unregister it and drop what
        it registered."""
        self.infos = [attrs.evolve(i, broken=reason, hooks=()) if i.name == name else i for i in self.infos]
        self.registries.drop(name)
        self.registries.broken[name] = next(i.distribution for i in self.infos if i.name == name)
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)


def build(
    *,
    load_entrypoints: bool = True,
    extra_plugins: Iterable[ModuleType | Any] = (),
    default_plugins: bool = True,
    strict: bool = False,
) -> Dare:
    """Build a plugin manager and fill fresh registries from it.

    :param load_entrypoints: load the installed ``dare`` entry points (subject to the
        ``DARE_PLUGINS``/``DARE_DISABLE_PLUGINS`` variables).
    :param extra_plugins: more plugin objects/modules to register (tests use this).
    :param default_plugins: register the core's generic components.
    :param strict: a plugin failing to import or to register raises (one-line :class:`DareError`
        for an import, the hook's own exception otherwise) instead of being recorded as broken.
    """
    dare = Dare(pluggy.PluginManager("dare"), Registries(), [])
    pm, infos = dare.pm, dare.infos
    pm.add_hookspecs(hookspecs)
    if default_plugins:
        for modname in DEFAULT_PLUGINS:
            pm.register(importlib.import_module(modname), name=modname)
            infos.append(_info(pm, modname, "dare-core", __version__, modname, True))
    for ep in _selected_entry_points() if load_entrypoints else ():
        dist, ver = (ep.dist.name, ep.dist.version) if ep.dist is not None else ("?", "?")
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken plugin must not take the others down
            infos.append(PluginInfo(ep.name, dist, ver, ep.value, (), False, one_line(exc)))
            if strict:
                raise DareError(infos[-1].broken_message()) from exc
            dare.disable(ep.name, one_line(exc))
            continue
        infos.append(attrs.evolve(_info(pm, ep.name, dist, ver, ep.value, False), example=_is_example(ep)))
    for i, plugin in enumerate(extra_plugins):
        name = getattr(plugin, "__name__", None) or f"extra-{i}"
        pm.register(plugin, name=name)
        infos.append(_info(pm, name, "-", "-", name, False))
    pm.hook.dare_addhooks.call_historic(kwargs={"pluginmanager": pm})
    for hook_name, attr in REGISTRATION_HOOKS.items():
        registry = dare.registries[attr]
        # get_hookimpls() lists implementations in registration order (pluggy *calls* them in
        # reverse); register in that order so the first plugin to claim a name owns it and a
        # duplicate error names the later plugin as the one to disable.
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            try:
                impl.function(register=_registrar(registry, impl.plugin_name))
            except DuplicateNameError:
                raise
            except Exception as exc:
                if strict:
                    raise
                dare.disable(impl.plugin_name, f"{hook_name} raised {one_line(exc)}")
    return dare


def _registrar(registry, owner: str) -> Callable[[Any], None]:
    def register(spec: Any) -> None:
        name = getattr(spec, "name", None)
        if not name:
            raise TypeError(f"plugin {owner!r} registered a {registry.kind} without a name")
        registry.register(name, spec, owner=owner)

    return register


def _is_example(ep: Any) -> bool:
    """Whether the entry point's distribution declares itself an example (``keywords`` holds
    ``dare-example`` in its pyproject.toml), as ``contrib/``'s do."""
    keywords = ep.dist.metadata.get("Keywords") if ep.dist is not None else None
    return EXAMPLE_KEYWORD in {k.strip() for k in (keywords or "").split(",")}


def _info(pm: pluggy.PluginManager, name: str, dist: str, version: str, module: str, builtin: bool) -> PluginInfo:
    plugin = pm.get_plugin(name)
    hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or []))
    return PluginInfo(name, dist, version, module, hooks, builtin)


_DARE: Optional[Dare] = None


def get_dare() -> Dare:
    """The process-wide :class:`Dare`, built on first use from the installed plugins (a broken
    plugin is skipped and listed by :meth:`Dare.broken`; with ``DARE_DEBUG=1`` it raises)."""
    global _DARE
    if _DARE is None:
        _DARE = build(strict=os.environ.get("DARE_DEBUG") == "1")
    return _DARE


def reset() -> None:
    """Forget the process-wide :class:`Dare` (tests; after installing a plugin)."""
    global _DARE
    _DARE = None
