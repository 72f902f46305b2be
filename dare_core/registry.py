"""Named registries.

A :class:`Registry` maps a name to an object and remembers which plugin registered it. It refuses
a name registered twice by different plugins (naming both) and answers an unknown name with one
line: what is installed, the closest match, and the ``pip install`` hint.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Generic, Iterable, Iterator, TypeVar

from dare_core.errors import DuplicateNameError, UnknownNameError

if TYPE_CHECKING:
    from dare_core.interfaces import (
        AlgorithmSpec,
        ComponentSpec,
        ConfigSection,
        EngineSpec,
        ModelFamily,
        RolloutSpec,
        TaskSpec,
        WorkflowSpec,
    )

T = TypeVar("T")


#: the component of a role an algorithm does not list in ``AlgorithmSpec.components``
DEFAULTS = {"trajectory": "final_sequence", "advantage": "group_norm"}

#: role -> the registry it is looked up in
ROLES = {
    "corruption": "corruptions",
    "trajectory": "trajectories",
    "estimator": "estimators",
    "loss": "losses",
    "advantage": "advantages",
}


def declared_names(components: dict[str, Any], role: str) -> tuple[str, ...]:
    """The names ``AlgorithmSpec.components`` lists for ``role`` (its default when it lists none)."""
    names = components.get(role, DEFAULTS.get(role, ()))
    return (names,) if isinstance(names, str) else tuple(names)


def close_name(name: str, names: Iterable[str]) -> str | None:
    """The name of ``names`` that ``name`` most likely meant: the same name in another case
    (``MyModel`` → ``mymodel``), else the closest spelling (:func:`difflib.get_close_matches`), else
    ``None``."""
    lowered = {n.lower(): n for n in names}
    key = name.lower()
    if key in lowered:
        return lowered[key]
    close = difflib.get_close_matches(key, list(lowered), n=1, cutoff=0.5)
    return lowered[close[0]] if close else None


def plugin_dist_hint(name: str) -> str:
    """The distribution that would provide ``name`` by the project's naming rule."""
    return "dare-plugin-" + name.replace("_", "-")


class Registry(Generic[T]):
    """Name → object, with the registering plugin recorded for every entry."""

    def __init__(
        self, kind: str, *, hint_install: bool = True, provider: str = "", broken: dict[str, str] | None = None
    ):
        self.kind = kind
        self.hint_install = hint_install
        self.provider = provider
        #: broken plugin id -> distribution (shared by the registries of one process)
        self.broken = {} if broken is None else broken
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}

    def register(self, name: str, obj: T, *, owner: str = "<unknown>") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._items:
            prev = self._owners[name]
            if prev == owner and self._items[name] is obj:
                return
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by plugin {prev!r} and by plugin "
                f"{owner!r}; uninstall or disable one of them (DARE_DISABLE_PLUGINS={owner})"
            )
        self._items[name] = obj
        self._owners[name] = owner

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        names = sorted(self._items)
        parts = [f"unknown {self.kind} {name!r}", "installed: " + (", ".join(names) or "none")]
        close = close_name(name, names)
        if close:
            parts.append(f"did you mean {close!r}?")
        if self.broken:
            parts.append(
                "broken plugins, not loaded: " + ", ".join(f"{n!r} ({d})" for n, d in sorted(self.broken.items()))
            )
        other_case = close is not None and close.lower() == name.lower()
        if self.hint_install and not other_case and plugin_dist_hint(name) not in self.broken.values():
            parts.append(f"if it is a plugin, install it: pip install {plugin_dist_hint(name)}")
        elif self.provider and name not in names:
            parts.append(f"the first-party {self.kind}s come with pip install {self.provider}")
        return "; ".join(parts)

    def owner(self, name: str) -> str:
        return self._owners[name]

    def drop(self, owner: str) -> None:
        """Forget every name ``owner`` registered."""
        for name in [n for n, o in self._owners.items() if o == owner]:
            del self._items[name], self._owners[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        for n in self.names():
            yield n, self._items[n]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"


class Registries:
    """All registries of one process, filled by the registration hooks: one typed field per kind
    (``registries.models.get(name) -> ModelFamily``)."""

    #: field -> the kind's name in messages
    KINDS = {
        "models": "model",
        "corruptions": "corruption",
        "trajectories": "trajectory builder",
        "estimators": "likelihood estimator",
        "losses": "policy loss",
        "rollouts": "rollout backend",
        "algorithms": "algorithm",
        "tasks": "task",
        "advantages": "advantage estimator",
        "config_sections": "config section",
        "engines": "engine",
        "workflows": "workflow",
    }

    #: the distributions of this repository that register a kind's first-party entries
    PROVIDERS = {
        "rollouts": "dare-plugin-samplers",
        "tasks": "dare-plugin-tasks",
        **dict.fromkeys(("corruptions", "estimators", "trajectories", "losses"), "dare-objectives"),
    }
    #: kinds whose unknown names are answered with a ``pip install dare-plugin-<name>`` hint
    HINT_INSTALL = ("models", "algorithms", "engines", "workflows")

    def __init__(self) -> None:
        self.broken: dict[str, str] = {}
        self.models: Registry[ModelFamily] = self._new("models")
        self.corruptions: Registry[ComponentSpec] = self._new("corruptions")
        self.trajectories: Registry[ComponentSpec] = self._new("trajectories")
        self.estimators: Registry[ComponentSpec] = self._new("estimators")
        self.losses: Registry[ComponentSpec] = self._new("losses")
        self.rollouts: Registry[RolloutSpec] = self._new("rollouts")
        self.algorithms: Registry[AlgorithmSpec] = self._new("algorithms")
        self.tasks: Registry[TaskSpec] = self._new("tasks")
        self.advantages: Registry[ComponentSpec] = self._new("advantages")
        self.config_sections: Registry[ConfigSection] = self._new("config_sections")
        self.engines: Registry[EngineSpec] = self._new("engines")
        self.workflows: Registry[WorkflowSpec] = self._new("workflows")

    def _new(self, attr: str) -> Registry[Any]:
        return Registry(
            self.KINDS[attr],
            hint_install=attr in self.HINT_INSTALL,
            provider=self.PROVIDERS.get(attr, ""),
            broken=self.broken,
        )

    def drop(self, owner: str) -> None:
        for attr in self.KINDS:
            self[attr].drop(owner)

    def __getitem__(self, attr: str) -> Registry[Any]:
        if attr not in self.KINDS:
            raise UnknownNameError(f"unknown registry {attr!r}; valid: {', '.join(sorted(self.KINDS))}")
        return getattr(self, attr)
