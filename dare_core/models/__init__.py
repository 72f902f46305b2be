"""Shared model-wrapper machinery for family plugins."""

from dare_core.models.base import HFDiffusionWrapper, gather_logprobs

__all__ = ["HFDiffusionWrapper", "gather_logprobs"]
