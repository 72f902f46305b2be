"""dare-plugin-llada: the LLaDA family (masked diffusion, bidirectional, unshifted logits).

:func:`dare_plugin_llada.hf.register_auto_classes` (called by the family's ``load`` and ``create``)
registers ``llada`` with transformers' Auto classes, so ``AutoModel.from_pretrained(path)`` loads
LLaDA checkpoints without ``trust_remote_code``. Registering the family imports neither torch nor
transformers.
"""

import os

from dare_core.api import ModelFamily, hookimpl, lazy
from dare_plugin_llada.config import BUNDLED, CAPABILITIES

__version__ = "0.1.0"


@hookimpl
def dare_register_model_wrappers(register):
    register(
        ModelFamily(
            name="llada",
            kind="masked",
            load=lazy("dare_plugin_llada.wrapper:load"),
            create=lazy("dare_plugin_llada.wrapper:create"),
            capabilities=CAPABILITIES,
            model_types=("llada",),
            config_keys=("d_model", "n_heads", "n_layers", "vocab_size"),
            context_key="max_sequence_length",
            default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
            default_rollout="low_confidence",
            rollouts=("low_confidence", "fast"),
            description="LLaDA: bidirectional masked diffusion (Nie et al. 2025, arXiv:2502.09992)",
        )
    )
