"""dare-plugin-sdar: the SDAR family (block diffusion; dense ``sdar`` and MoE ``sdar_moe``).

:func:`dare_plugin_sdar.hf.register_auto_classes` (called by the family's ``load`` and ``create``)
registers ``sdar`` and ``sdar_moe`` with transformers' Auto classes, so
``AutoModelForCausalLM.from_pretrained(path)`` (and ``AutoModel`` for the decoder stack) load SDAR
checkpoints without ``trust_remote_code``. Registering the family imports neither torch nor
transformers.
"""

import os

from dare_core.api import ModelFamily, hookimpl, lazy
from dare_plugin_sdar.config import BUNDLED, CAPABILITIES, DEFAULT_BLOCK_SIZE

__version__ = "0.1.0"


@hookimpl
def dare_register_model_wrappers(register):
    register(
        ModelFamily(
            name="sdar",
            kind="block",
            load=lazy("dare_plugin_sdar.wrapper:load"),
            create=lazy("dare_plugin_sdar.wrapper:create"),
            capabilities=CAPABILITIES,
            model_types=("sdar", "sdar_moe"),
            config_keys=("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"),
            default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
            default_rollout="block",
            rollouts=("block",),
            block_size=DEFAULT_BLOCK_SIZE,
            description="SDAR: block diffusion on Qwen3 / Qwen3-MoE (Cheng et al. 2025, arXiv:2510.06303)",
        )
    )
