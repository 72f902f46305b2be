"""dare-plugin-llada2: the LLaDA2.x family (``llada2_moe``: LLaDA2.0-mini and LLaDA2.1-mini).

Block diffusion with a group-limited sigmoid MoE. Importing this package registers
``llada2_moe`` with transformers' Auto classes, so ``AutoModelForCausalLM.from_pretrained(path)``
loads LLaDA2 checkpoints without ``trust_remote_code``. Registers the ``llada2`` model family and
two rollout backends: ``llada2_threshold`` (LLaDA2.0 decoding) and ``llada2_editing`` (LLaDA2.1).
"""

import os

from dare_core.api import hookimpl, ModelFamily, RolloutSpec

from dare_plugin_llada2.hf import register_auto_classes
from dare_plugin_llada2.sampler import (
    SUPPORTED_RECORDS,
    EditingConfig,
    EditingSampler,
    ThresholdConfig,
    ThresholdSampler,
)
from dare_plugin_llada2.wrapper import BUNDLED, CAPABILITIES, DEFAULT_BLOCK_SIZE, create, load

__version__ = "0.1.0"

register_auto_classes()


@hookimpl
def dare_register_model_wrappers(register):
    register(ModelFamily(
        name="llada2",
        kind="block",
        load=load,
        create=create,
        capabilities=CAPABILITIES,
        model_types=("llada2_moe",),
        config_keys=("hidden_size", "num_attention_heads", "num_hidden_layers", "num_experts", "vocab_size"),
        default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
        default_rollout="llada2_threshold",
        rollouts=("llada2_threshold", "llada2_editing", "block"),
        block_size=DEFAULT_BLOCK_SIZE,
        description="LLaDA2.0/2.1-mini: block diffusion, group-limited sigmoid MoE (inclusionAI 2025)",
    ))


@hookimpl
def dare_register_rollout_backends(register):
    register(RolloutSpec(
        name="llada2_threshold",
        config_cls=ThresholdConfig,
        build=ThresholdSampler,
        kinds=frozenset({"block"}),
        records=SUPPORTED_RECORDS,
        description="LLaDA2.0 block decoding: commit tokens above a probability threshold, else the "
                    "quota schedule (optional KV cache of finished blocks)",
    ))
    register(RolloutSpec(
        name="llada2_editing",
        config_cls=EditingConfig,
        build=EditingSampler,
        kinds=frozenset({"block"}),
        records=SUPPORTED_RECORDS,
        description="LLaDA2.1 block decoding with token editing (re-writes confident changed tokens "
                    "of the current block)",
    ))
