"""dare-plugin-llada: the LLaDA family (masked diffusion, bidirectional, unshifted logits).

Importing this package registers ``llada`` with transformers' Auto classes, so
``AutoModel.from_pretrained(path)`` loads LLaDA checkpoints without ``trust_remote_code``.
"""

import os

from dare_core.api import hookimpl, ModelFamily

from dare_plugin_llada.hf import register_auto_classes
from dare_plugin_llada.wrapper import BUNDLED, CAPABILITIES, create, load

__version__ = "0.1.0"

register_auto_classes()


@hookimpl
def dare_register_model_wrappers(register):
    register(ModelFamily(
        name="llada",
        kind="masked",
        load=load,
        create=create,
        capabilities=CAPABILITIES,
        model_types=("llada",),
        config_keys=("d_model", "n_heads", "n_layers", "vocab_size"),
        context_key="max_sequence_length",
        default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
        default_rollout="low_confidence",
        rollouts=("low_confidence", "fast"),
        description="LLaDA: bidirectional masked diffusion (Nie et al. 2025, arXiv:2502.09992)",
    ))
