"""dare-plugin-dream: the Dream family (masked diffusion, bidirectional, AR-aligned logits).

:func:`dare_plugin_dream.hf.register_auto_classes` (called by the family's ``load`` and ``create``)
registers ``Dream`` with transformers' AutoConfig / AutoModel and the published ``DreamTokenizer``
name with AutoTokenizer, so ``AutoModel.from_pretrained(path)`` and ``AutoTokenizer.from_pretrained(path)``
load Dream checkpoints without ``trust_remote_code``. Registering the family imports neither torch
nor transformers.
"""

import os

from dare_core.api import ModelFamily, RolloutSpec, hookimpl, lazy
from dare_plugin_dream.config import BUNDLED, CAPABILITIES, SUPPORTED_RECORDS, DreamSamplerConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_model_wrappers(register):
    register(
        ModelFamily(
            name="dream",
            kind="masked",
            load=lazy("dare_plugin_dream.wrapper:load"),
            create=lazy("dare_plugin_dream.wrapper:create"),
            load_tokenizer=lazy("dare_plugin_dream.tokenization_dream:load_tokenizer"),
            capabilities=CAPABILITIES,
            model_types=("Dream",),
            config_keys=("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"),
            default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
            default_rollout="dream_generate",
            rollouts=("dream_generate", "low_confidence", "fast"),
            description="Dream: Qwen2-initialised bidirectional masked diffusion, AR-shifted logits "
            "(Ye et al. 2025, arXiv:2508.15487)",
        )
    )


@hookimpl
def dare_register_rollout_backends(register):
    register(
        RolloutSpec(
            name="dream_generate",
            config_cls=DreamSamplerConfig,
            build=lazy("dare_plugin_dream.sampler:DreamSampler"),
            kinds=frozenset({"masked"}),
            requires=frozenset({"mask_token"}),
            records=SUPPORTED_RECORDS,
            description="Dream's diffusion_generate: whole-window denoising on a linspace(1, eps) schedule "
            "(origin / maskgit_plus / topk_margin / entropy, top-p, top-k, alg_temp; no cache)",
        )
    )
