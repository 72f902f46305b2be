"""The ``vllm`` rollout backend's config (the ``rollout:`` section), importable without torch or
vLLM: the plugin registers it without importing either."""

from __future__ import annotations

import attrs

from dare_core.api import in_range, non_negative, one_of, option, positive

DTYPES = ("auto", "bfloat16", "float16", "float32")


@attrs.frozen
class VLLMRolloutConfig:
    """Config of the ``vllm`` rollout backend (the ``rollout:`` section)."""

    gen_length: int = option(
        256,
        "Response length R: each request generates at most this many tokens (vLLM max_tokens, "
        "whole canvases of the model's canvas_length, cut at the first stop token); shorter "
        "responses are padded with the pad token.",
        positive,
    )
    max_denoising_steps: int = option(
        0,
        "Most denoising iterations per canvas (vLLM diffusion_config.max_denoising_steps); 0 = "
        "the checkpoint's generation_config.json (transformers' default 48 when it sets none).",
        non_negative,
    )
    logprobs: bool = option(
        True,
        "Ask the engine for the log-probability of each emitted token (at the step its canvas "
        "settled, under that step's temperature) and return it as extras['engine_logprobs'] [B, R] "
        "for the engine/trainer mismatch metric; the loss never uses it.",
    )
    reseed: bool = option(
        True,
        "Draw a seed from the run's random stream for every generate call and reseed the "
        "engine's random streams with it, so a run is reproducible (vLLM refuses per-request seeds "
        "for diffusion models); false = the engine's own stream runs on.",
    )
    gpu_memory_utilization: float = option(
        0.3,
        "Share of the GPU's memory the engine may take for its weights, activations and KV "
        "cache; it shares the GPU with training, so leave room for the policy, its gradients and "
        "the optimizer state.",
        in_range(0.0, 1.0, low_open=True),
    )
    dtype: str = option(
        "bfloat16",
        "Weight and activation dtype of the engine (it casts the weights it is given); "
        "'auto' = the dtype of the exported policy's parameters (float32 master weights under "
        "engine.precision=bf16-mixed).",
        one_of(DTYPES),
    )
    enforce_eager: bool = option(
        False, "Run the engine eagerly (no CUDA graphs): faster start and less memory, slower generation."
    )
    max_num_seqs: int = option(
        0, "Most requests the engine runs at once (its batch); 0 = vLLM's default.", non_negative
    )
    max_model_len: int = option(
        0, "Longest prompt + response the engine plans KV cache for; 0 = the checkpoint's context length.", non_negative
    )
    tensor_parallel_size: int = option(
        1,
        "GPUs one engine shards the model over (vLLM tensor parallelism); more than 1 only in a "
        "single-process run: under torchrun every rank runs its own engine on its own GPU.",
        positive,
    )
    attention_backend: str = option(
        "", "vLLM attention backend name (e.g. TRITON_ATTN, FLASH_ATTN); '' = vLLM's choice."
    )
    export_dir: str = option(
        "",
        "Directory under which the policy is exported for the engine to start from (a "
        "temporary subdirectory, removed with the engine); '' = the system's temporary directory.",
    )
