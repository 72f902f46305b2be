"""Named registries.

A :class:`Registry` maps a name to an object and remembers which plugin registered it. It refuses
a name registered twice by different plugins (naming both) and answers an unknown name with one
line: what is installed, the closest match, and the ``pip install`` hint.
"""

from __future__ import annotations

import difflib
from typing import Any, Generic, Iterator, TypeVar

from dare_core.errors import DuplicateNameError, UnknownNameError

T = TypeVar("T")


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
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        if close:
            parts.append(f"did you mean {close[0]!r}?")
        if self.broken:
            parts.append(
                "broken plugins, not loaded: " + ", ".join(f"{n!r} ({d})" for n, d in sorted(self.broken.items()))
            )
        if self.hint_install and plugin_dist_hint(name) not in self.broken.values():
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
    """All registries of one process, filled by the registration hooks."""

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

    def __init__(self) -> None:
        self.broken: dict[str, str] = {}
        for attr, kind in self.KINDS.items():
            setattr(
                self,
                attr,
                Registry(
                    kind,
                    hint_install=attr in ("models", "algorithms", "engines", "workflows"),
                    provider=self.PROVIDERS.get(attr, ""),
                    broken=self.broken,
                ),
            )

    def drop(self, owner: str) -> None:
        for attr in self.KINDS:
            getattr(self, attr).drop(owner)

    def __getitem__(self, attr: str) -> Registry[Any]:
        if attr not in self.KINDS:
            raise UnknownNameError(f"unknown registry {attr!r}; valid: {', '.join(sorted(self.KINDS))}")
        return getattr(self, attr)
