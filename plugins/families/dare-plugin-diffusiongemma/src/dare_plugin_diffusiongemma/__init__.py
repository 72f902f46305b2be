"""dare-plugin-diffusiongemma: the DiffusionGemma family (canvas block diffusion with uniform noise).

The model is transformers' own ``DiffusionGemmaForBlockDiffusion`` (``model_type:
diffusion_gemma``); this plugin adapts it to DARE's seams (:mod:`dare_plugin_diffusiongemma.wrapper`)
and registers transformers' ``generate`` as the ``entropy_bound`` rollout backend
(:mod:`dare_plugin_diffusiongemma.sampler`). Registering the family imports neither torch nor
transformers.
"""

import os

from dare_core.api import ModelFamily, RolloutSpec, hookimpl, lazy
from dare_plugin_diffusiongemma.config import BUNDLED, CAPABILITIES, MODEL_TYPE, RECORDS, EntropyBoundConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_model_wrappers(register):
    register(
        ModelFamily(
            name="diffusiongemma",
            kind="block",
            load=lazy("dare_plugin_diffusiongemma.wrapper:load"),
            create=lazy("dare_plugin_diffusiongemma.wrapper:create"),
            capabilities=CAPABILITIES,
            model_types=(MODEL_TYPE,),
            # the text sizes sit under text_config (preflight reads top-level keys only), so the
            # context length is not checked before loading
            config_keys=("text_config", "vision_config", "canvas_length"),
            context_key=None,
            default_checkpoint=BUNDLED if os.path.isdir(BUNDLED) else None,
            default_rollout="entropy_bound",
            rollouts=("entropy_bound", "vllm"),
            block_size=256,
            description="DiffusionGemma: Gemma 4 MoE encoder + canvas decoder, uniform-noise block diffusion "
            "(transformers' DiffusionGemmaForBlockDiffusion)",
        )
    )


@hookimpl
def dare_register_rollout_backends(register):
    register(
        RolloutSpec(
            name="entropy_bound",
            config_cls=EntropyBoundConfig,
            build=lazy("dare_plugin_diffusiongemma.sampler:EntropyBoundSampler"),
            kinds=frozenset({"block"}),
            records=RECORDS,
            requires=frozenset({"uniform_noise"}),
            description="DiffusionGemma's generate: canvases from uniform noise, entropy-bound acceptance and "
            "renoising, linear temperature schedule, adaptive stopping (transformers' sampler)",
        )
    )
