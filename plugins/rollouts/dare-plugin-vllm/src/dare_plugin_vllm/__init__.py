"""The ``vllm`` rollout backend: DiffusionGemma rollouts in vLLM's offline engine, which runs in
the training process and follows the policy through ``load_weights`` after every RL step (see
this plugin's README and docs/vllm.md). Registering imports neither torch nor vLLM."""

from __future__ import annotations

from dare_core.api import RolloutSpec, hookimpl, lazy
from dare_plugin_vllm.config import VLLMRolloutConfig


@hookimpl
def dare_register_rollout_backends(register) -> None:
    register(
        RolloutSpec(
            name="vllm",
            config_cls=VLLMRolloutConfig,
            build=lazy("dare_plugin_vllm.backend:VLLMRollout"),
            kinds=frozenset({"block"}),
            requires=frozenset({"uniform_noise"}),
            sync="state",
            description=(
                "vLLM's offline engine (needs the [vllm] extra and a GPU) for uniform-noise "
                "canvas models (DiffusionGemma); weights pushed after every RL step"
            ),
        )
    )
