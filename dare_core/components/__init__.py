"""Generic, tested components shared by algorithm plugins, and the lookup that builds them."""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from dare_core.components.advantages import GroupNormAdvantage, RLOOAdvantage
from dare_core.components.corruptions import RandomRatioMasking
from dare_core.components.estimators import MaskedTokenLogProb, ResponseTokenLogProb, corrupted_logprobs
from dare_core.components.losses import ClippedPolicyLoss, agg_loss, masked_mean
from dare_core.components.trajectories import FinalSequence
from dare_core.errors import DareError
from dare_core.interfaces import Components
from dare_core.registry import DEFAULTS, ROLES, declared_names

C = TypeVar("C", bound="Components")


class ComponentLookup:
    """Builds an algorithm's registered components by role: ``lookup.loss(clip_ratio_low=0.2)``
    builds the loss its spec declares, so ``AlgorithmSpec.build`` composes components of any
    plugin without importing them and names none a second time. A role with alternatives takes the
    chosen one's name (``lookup.estimator("x", ...)``); a name the spec does not declare is refused.

    Args:
        registries: the process's registries.
        rollout: the run's training rollout config (``RunConfig.train_rollout``; ``None`` outside a
            run), where an algorithm reads rollout settings such as ``block_length``.
        components: the spec's ``AlgorithmSpec.components``; ``None`` or empty = any registered
            name (tests composing components by hand; every algorithm plugin declares its
            components, which its contract suite checks).
    """

    def __init__(self, registries: Any, rollout: Any = None, components: dict[str, Any] | None = None):
        self._r = registries
        self.rollout = rollout
        self._declared = components or None
        #: names looked up so far, in order
        self.built: list[str] = []

    def _make(self, role: str, name: str | None, **kwargs: Any) -> Any:
        name = self._name(role, name)
        component = self._r[ROLES[role]].get(name).factory(**kwargs)
        self.built.append(name)
        return component

    def _name(self, role: str, name: str | None) -> str:
        if self._declared is None:
            if name is None:
                raise DareError(f"lookup.{role}() needs a name when no algorithm spec declares the {role}")
            return name
        names = declared_names(self._declared, role)
        if name is None and len(names) == 1:
            return names[0]
        if name is None or name not in names:
            raise DareError(
                f"{role} {name!r} is not declared in AlgorithmSpec.components (declared: "
                f"{', '.join(names) or 'none'}); list it there, the one place an algorithm names its components"
            )
        return name

    def corruption(self, name: str | None = None, **kwargs: Any) -> Any:
        return self._make("corruption", name, **kwargs)

    def trajectory(self, name: str | None = None, **kwargs: Any) -> Any:
        return self._make("trajectory", name, **kwargs)

    def estimator(self, name: str | None = None, **kwargs: Any) -> Any:
        return self._make("estimator", name, **kwargs)

    def loss(self, name: str | None = None, **kwargs: Any) -> Any:
        return self._make("loss", name, **kwargs)

    def advantage(self, name: str | None = None, **kwargs: Any) -> Any:
        return self._make("advantage", name, **kwargs)

    def with_defaults(self, components: C) -> C:
        """``components`` with the registry's default (:data:`DEFAULTS`) built for each role its
        bundle has and the algorithm left ``None`` (an RL bundle's trajectory and advantage)."""
        fields = attrs.fields_dict(type(components))
        changes = {
            role: self._r[ROLES[role]].get(name).factory()
            for role, name in DEFAULTS.items()
            if role in fields and getattr(components, role) is None
        }
        return attrs.evolve(components, **changes) if changes else components


__all__ = [
    "ClippedPolicyLoss",
    "ComponentLookup",
    "DEFAULTS",
    "FinalSequence",
    "GroupNormAdvantage",
    "MaskedTokenLogProb",
    "RLOOAdvantage",
    "RandomRatioMasking",
    "ResponseTokenLogProb",
    "agg_loss",
    "corrupted_logprobs",
    "masked_mean",
]
