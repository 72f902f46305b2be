"""dare-plugin-sdar: the SDAR family (block diffusion; dense ``sdar`` and MoE ``sdar_moe``).

Importing this package registers ``sdar`` and ``sdar_moe`` with transformers' Auto classes, so
``AutoModelForCausalLM.from_pretrained(path)`` (and ``AutoModel`` for the decoder stack) load SDAR
checkpoints without ``trust_remote_code``.
"""

import os

from dare_core.api import hookimpl, ModelFamily

from dare_plugin_sdar.hf import register_auto_classes
from dare_plugin_sdar.wrapper import BUNDLED, CAPABILITIES, DEFAULT_BLOCK_SIZE, create, load

__version__ = "0.1.0"

register_auto_classes()


@hookimpl
def dare_register_model_wrappers(register):
    register(ModelFamily(
        name="sdar",
        kind="block",
        load=load,
        create=create,
        capabilities=CAPABILITIES,
        model_types=("sdar", "sdar_moe"),
        config_keys=("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"),
        default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
        default_rollout="block",
        rollouts=("block",),
        block_size=DEFAULT_BLOCK_SIZE,
        description="SDAR: block diffusion on Qwen3 / Qwen3-MoE (Cheng et al. 2025, arXiv:2510.06303)",
    ))
