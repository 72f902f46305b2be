"""Registration of the native Dream classes with the transformers Auto factories.

The published Dream config maps ``auto_map`` = {AutoConfig: configuration_dream.DreamConfig,
AutoModel: modeling_dream.DreamModel} and its tokenizer_config.json maps AutoTokenizer to
tokenization_dream.DreamTokenizer. After :func:`register_auto_classes`,
``AutoConfig.from_pretrained(path)``, ``AutoModel.from_pretrained(path)`` and
``AutoTokenizer.from_pretrained(path)`` resolve ``"model_type": "Dream"`` and
``"tokenizer_class": "DreamTokenizer"`` to :class:`DreamConfig`, :class:`DreamModel` and
:class:`~dare_plugin_dream.tokenization_dream.DreamTokenizer` without ``trust_remote_code``
(transformers prefers registered local classes when ``trust_remote_code`` is not given, even if
the files still carry the ``auto_map``). A Dream checkpoint whose tokenizer_config.json names
another class (DARE's tiny checkpoints: ``TokenizersBackend``) keeps that class; one that names
none gets ``DreamTokenizer``, as transformers maps ``qwen2`` to its Qwen2 tokenizer.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoTokenizer

from .configuration_dream import DreamConfig
from .modeling_dream import DreamModel
from .tokenization_dream import DreamTokenizer

__all__ = ["register_auto_classes"]


def register_auto_classes() -> None:
    """Register ``Dream`` with AutoConfig, AutoModel and AutoTokenizer (idempotent)."""
    AutoConfig.register(DreamConfig.model_type, DreamConfig, exist_ok=True)
    AutoModel.register(DreamConfig, DreamModel, exist_ok=True)
    AutoTokenizer.register(DreamConfig, tokenizer_class=DreamTokenizer, exist_ok=True)
