"""Rollout backends: the reference low-confidence sampler, the cached ``fast`` sampler and the
block-diffusion sampler (see this plugin's README). Each starts the response as MASK tokens and
reveals them, so each requires the ``mask_token`` capability."""

from __future__ import annotations

from dare_core.api import RolloutSpec, hookimpl, lazy
from dare_plugin_samplers.config import (
    BLOCK_RECORDS,
    FAST_RECORDS,
    LOW_CONFIDENCE_RECORDS,
    RESUMABLE,
    BlockRolloutConfig,
    FastConfig,
    LowConfidenceConfig,
)


@hookimpl
def dare_register_rollout_backends(register) -> None:
    register(
        RolloutSpec(
            name="low_confidence",
            config_cls=LowConfidenceConfig,
            build=lazy("dare_plugin_samplers.low_confidence:LowConfidenceSampler"),
            kinds=frozenset({"masked"}),
            requires=frozenset({"mask_token"}),
            records=LOW_CONFIDENCE_RECORDS,
            methods=RESUMABLE,
            description=(
                "semi-autoregressive low-confidence remasking for bidirectional masked "
                "diffusion models (blocks, quota schedule, optional guidance; no cache)"
            ),
        )
    )
    register(
        RolloutSpec(
            name="fast",
            config_cls=FastConfig,
            build=lazy("dare_plugin_samplers.fast:FastSampler"),
            kinds=frozenset({"masked"}),
            records=FAST_RECORDS,
            requires=frozenset({"kv_cache", "mask_token"}),
            description=(
                "block-wise masked-diffusion sampler with a prefix or dual KV cache and "
                "confidence-threshold parallel decoding (needs kv_cache)"
            ),
        )
    )
    register(
        RolloutSpec(
            name="block",
            config_cls=BlockRolloutConfig,
            build=lazy("dare_plugin_samplers.block:BlockSampler"),
            kinds=frozenset({"block"}),
            requires=frozenset({"mask_token"}),
            records=BLOCK_RECORDS,
            methods=RESUMABLE,
            description=(
                "block-diffusion generation: prompt prefill and per-block denoising with a "
                "block KV cache, sequential / static / dynamic-threshold / entropy-bounded "
                "reveal"
            ),
        )
    )
