"""dare-plugin-llada2: the LLaDA2.x family (``llada2_moe``: LLaDA2.0-mini and LLaDA2.1-mini).

Block diffusion with a group-limited sigmoid MoE. :func:`dare_plugin_llada2.hf.register_auto_classes`
(called by the family's ``load`` and ``create``) registers ``llada2_moe`` with transformers' Auto
classes, so ``AutoModelForCausalLM.from_pretrained(path)`` loads LLaDA2 checkpoints without
``trust_remote_code``. Registers the ``llada2`` model family and two rollout backends:
``llada2_threshold`` (LLaDA2.0 decoding) and ``llada2_editing`` (LLaDA2.1), importing neither torch
nor transformers.
"""

import os

from dare_core.api import ModelFamily, RolloutSpec, hookimpl, lazy
from dare_plugin_llada2.config import (
    BUNDLED,
    CAPABILITIES,
    DEFAULT_BLOCK_SIZE,
    SUPPORTED_RECORDS,
    EditingConfig,
    ThresholdConfig,
)

__version__ = "0.1.0"


@hookimpl
def dare_register_model_wrappers(register):
    register(
        ModelFamily(
            name="llada2",
            kind="block",
            load=lazy("dare_plugin_llada2.wrapper:load"),
            create=lazy("dare_plugin_llada2.wrapper:create"),
            capabilities=CAPABILITIES,
            model_types=("llada2_moe",),
            config_keys=("hidden_size", "num_attention_heads", "num_hidden_layers", "num_experts", "vocab_size"),
            default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
            default_rollout="llada2_threshold",
            rollouts=("llada2_threshold", "llada2_editing", "block"),
            block_size=DEFAULT_BLOCK_SIZE,
            description="LLaDA2.0/2.1-mini: block diffusion, group-limited sigmoid MoE (inclusionAI 2025)",
        )
    )


@hookimpl
def dare_register_rollout_backends(register):
    register(
        RolloutSpec(
            name="llada2_threshold",
            config_cls=ThresholdConfig,
            build=lazy("dare_plugin_llada2.sampler:ThresholdSampler"),
            kinds=frozenset({"block"}),
            requires=frozenset({"mask_token"}),
            records=SUPPORTED_RECORDS,
            description="LLaDA2.0 block decoding: commit tokens above a probability threshold, else the "
            "quota schedule (optional KV cache of finished blocks)",
        )
    )
    register(
        RolloutSpec(
            name="llada2_editing",
            config_cls=EditingConfig,
            build=lazy("dare_plugin_llada2.sampler:EditingSampler"),
            kinds=frozenset({"block"}),
            requires=frozenset({"mask_token"}),
            records=SUPPORTED_RECORDS,
            description="LLaDA2.1 block decoding with token editing (re-writes confident changed tokens "
            "of the current block)",
        )
    )
