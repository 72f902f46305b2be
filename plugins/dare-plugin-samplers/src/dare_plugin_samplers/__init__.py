"""Rollout backends: the reference low-confidence sampler, the cached ``fast`` sampler and the
block-diffusion sampler (see this plugin's README)."""

from __future__ import annotations

from dare_core.api import hookimpl, RolloutSpec

from dare_plugin_samplers.block import SUPPORTED_RECORDS as BLOCK_RECORDS
from dare_plugin_samplers.block import BlockRolloutConfig, BlockSampler
from dare_plugin_samplers.fast import SUPPORTED_RECORDS as FAST_RECORDS
from dare_plugin_samplers.fast import FastConfig, FastSampler
from dare_plugin_samplers.low_confidence import SUPPORTED_RECORDS as LC_RECORDS
from dare_plugin_samplers.low_confidence import LowConfidenceConfig, LowConfidenceSampler

#: the optional methods of LowConfidenceSampler and BlockSampler: resuming partial responses
RESUMABLE = frozenset({"continue_from", "total_steps"})


@hookimpl
def dare_register_rollout_backends(register) -> None:
    register(
        RolloutSpec(
            name="low_confidence",
            config_cls=LowConfidenceConfig,
            build=LowConfidenceSampler,
            kinds=frozenset({"masked"}),
            records=LC_RECORDS,
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
            build=FastSampler,
            kinds=frozenset({"masked"}),
            records=FAST_RECORDS,
            requires=frozenset({"kv_cache"}),
            description=(
                "block-wise masked-diffusion sampler with a prefix or dual KV cache and "
                "confidence-threshold parallel decoding (needs kv_cache)"
            ),
        )
    )
    register(RolloutSpec(
        name="block",
        config_cls=BlockRolloutConfig,
        build=BlockSampler,
        kinds=frozenset({"block"}),
        records=BLOCK_RECORDS,
        methods=RESUMABLE,
        description=("block-diffusion generation: prompt prefill and per-block denoising with a "
                     "block KV cache, sequential / static / dynamic-threshold / entropy-bounded "
                     "reveal"),
    ))
