"""Shared model-wrapper machinery for family plugins (imported on first use: torch)."""

__all__ = ["HFDiffusionWrapper", "gather_logprobs"]


def __getattr__(name: str):
    if name in __all__:
        from dare_core.models import base

        return getattr(base, name)
    raise AttributeError(f"module 'dare_core.models' has no attribute {name!r}")
