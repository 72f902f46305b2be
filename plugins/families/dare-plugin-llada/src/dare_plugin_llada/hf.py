"""Registration of the native LLaDA classes with the transformers Auto* factories.

After :func:`register_auto_classes`, ``AutoConfig`` / ``AutoModel`` /
``AutoModelForCausalLM`` ``.from_pretrained(path)`` resolve ``"model_type":
"llada"`` to :class:`LLaDAConfig` / :class:`LLaDAModelLM` without
``trust_remote_code``.  A published checkpoint whose config.json still carries
an ``auto_map`` to remote code also resolves to the native classes (transformers
prefers registered local code when ``trust_remote_code`` is not given).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_llada import LLaDAConfig
from .modeling_llada import LLaDAModelLM

__all__ = ["register_auto_classes"]


def register_auto_classes() -> None:
    """Register ``llada`` with AutoConfig, AutoModel and AutoModelForCausalLM (idempotent)."""
    AutoConfig.register(LLaDAConfig.model_type, LLaDAConfig, exist_ok=True)
    AutoModel.register(LLaDAConfig, LLaDAModelLM, exist_ok=True)
    AutoModelForCausalLM.register(LLaDAConfig, LLaDAModelLM, exist_ok=True)
