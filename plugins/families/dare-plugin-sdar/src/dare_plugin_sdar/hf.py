"""Registration of the native SDAR classes with the transformers Auto* factories.

The published configs map ``AutoModel`` to the decoder stack (``SDARModel`` / ``SDARMoeModel``) and
``AutoModelForCausalLM`` to the LM (``SDARForCausalLM`` / ``SDARMoeForCausalLM``); after
:func:`register_auto_classes` both resolve to the native classes here for ``"model_type": "sdar"``
and ``"sdar_moe"``, without ``trust_remote_code``.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_sdar import SDARConfig, SDARMoeConfig
from .modeling_sdar import SDARForCausalLM, SDARModel
from .modeling_sdar_moe import SDARMoeForCausalLM, SDARMoeModel

__all__ = ["register_auto_classes"]


def register_auto_classes() -> None:
    """Register ``sdar`` and ``sdar_moe`` with AutoConfig, AutoModel and AutoModelForCausalLM (idempotent)."""
    for config, base, lm in (
        (SDARConfig, SDARModel, SDARForCausalLM),
        (SDARMoeConfig, SDARMoeModel, SDARMoeForCausalLM),
    ):
        AutoConfig.register(config.model_type, config, exist_ok=True)
        AutoModel.register(config, base, exist_ok=True)
        AutoModelForCausalLM.register(config, lm, exist_ok=True)
