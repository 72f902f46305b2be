"""Registration of the native Dream classes with the transformers Auto factories.

The published Dream config maps ``auto_map`` = {AutoConfig: configuration_dream.DreamConfig,
AutoModel: modeling_dream.DreamModel}. After :func:`register_auto_classes`,
``AutoConfig.from_pretrained(path)`` and ``AutoModel.from_pretrained(path)`` resolve
``"model_type": "Dream"`` to :class:`DreamConfig` / :class:`DreamModel` without
``trust_remote_code`` (transformers prefers registered local classes when ``trust_remote_code``
is not given, even if the config still carries the ``auto_map``).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel

from .configuration_dream import DreamConfig
from .modeling_dream import DreamModel

__all__ = ["register_auto_classes"]


def register_auto_classes() -> None:
    """Register ``Dream`` with AutoConfig and AutoModel (idempotent)."""
    AutoConfig.register(DreamConfig.model_type, DreamConfig, exist_ok=True)
    AutoModel.register(DreamConfig, DreamModel, exist_ok=True)
