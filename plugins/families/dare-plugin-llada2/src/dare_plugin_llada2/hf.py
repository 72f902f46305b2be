"""Registration of the native LLaDA2 classes with the transformers Auto* factories.

The published ``config.json`` maps ``AutoConfig`` -> ``LLaDA2MoeConfig``, ``AutoModel`` ->
``LLaDA2MoeModel`` (the backbone) and ``AutoModelForCausalLM`` -> ``LLaDA2MoeModelLM``. After
:func:`register_auto_classes` the same three resolve ``"model_type": "llada2_moe"`` to the
native classes here, without ``trust_remote_code`` (a published config's ``auto_map`` is then
ignored: transformers prefers registered local code when ``trust_remote_code`` is not given).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_llada2_moe import LLaDA2MoeConfig
from .modeling_llada2_moe import LLaDA2MoeModel, LLaDA2MoeModelLM

__all__ = ["register_auto_classes"]


def register_auto_classes() -> None:
    """Register ``llada2_moe`` with AutoConfig, AutoModel and AutoModelForCausalLM (idempotent)."""
    AutoConfig.register(LLaDA2MoeConfig.model_type, LLaDA2MoeConfig, exist_ok=True)
    AutoModel.register(LLaDA2MoeConfig, LLaDA2MoeModel, exist_ok=True)
    AutoModelForCausalLM.register(LLaDA2MoeConfig, LLaDA2MoeModelLM, exist_ok=True)
