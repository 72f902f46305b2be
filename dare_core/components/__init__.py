"""Generic, tested components shared by algorithm plugins, and the lookup that builds them."""

from __future__ import annotations

from typing import Any

from dare_core.components.advantages import GroupNormAdvantage, RLOOAdvantage
from dare_core.components.corruptions import RandomRatioMasking
from dare_core.components.estimators import MaskedTokenLogProb, ResponseTokenLogProb, corrupted_logprobs
from dare_core.components.losses import ClippedPolicyLoss, agg_loss, masked_mean
from dare_core.components.trajectories import FinalSequence


class ComponentLookup:
    """Builds registered components by name: ``lookup.loss("clipped_pg", clip_ratio_low=0.2)``, so
    an algorithm's ``AlgorithmSpec.build`` composes components of any plugin without importing
    them. ``rollout``: the run's resolved rollout config (``None`` outside a run), where an
    algorithm reads rollout settings such as ``block_length`` instead of declaring them again."""

    def __init__(self, registries: Any, rollout: Any = None):
        self._r = registries
        self.rollout = rollout
        #: names looked up so far, in order (the contract suite checks them against the spec)
        self.built: list[str] = []

    def _make(self, registry: str, name: str, **kwargs: Any) -> Any:
        component = self._r[registry].get(name).factory(**kwargs)
        self.built.append(name)
        return component

    def corruption(self, name: str, **kwargs: Any) -> Any:
        return self._make("corruptions", name, **kwargs)

    def trajectory(self, name: str, **kwargs: Any) -> Any:
        return self._make("trajectories", name, **kwargs)

    def estimator(self, name: str, **kwargs: Any) -> Any:
        return self._make("estimators", name, **kwargs)

    def loss(self, name: str, **kwargs: Any) -> Any:
        return self._make("losses", name, **kwargs)

    def advantage(self, name: str, **kwargs: Any) -> Any:
        return self._make("advantages", name, **kwargs)


__all__ = [
    "ClippedPolicyLoss",
    "ComponentLookup",
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
