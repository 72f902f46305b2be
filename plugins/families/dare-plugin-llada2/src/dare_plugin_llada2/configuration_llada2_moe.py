"""Configuration of the native LLaDA2.x (``llada2_moe``) implementation.

Field names are those of the ``config.json`` published with LLaDA2.0-mini / LLaDA2.1-mini and
the defaults are that checkpoint's values, so a published config loads unchanged (its
``auto_map`` is kept as a plain attribute and ignored: the classes registered by
:mod:`dare_plugin_llada2.hf` are used, no ``trust_remote_code``).

Flags that the published modeling code never reads keep their published value and change
nothing here either (the behaviour they name is hard-wired there and here):
``score_function`` (always sigmoid), ``norm_topk_prob`` (always renormalised), ``router_dtype``
(router always in float32), ``moe_router_enable_expert_bias`` (``expert_bias`` always built),
``use_qk_norm`` (q/k norms always built), ``norm_head``, ``norm_softmax``, ``use_rmsnorm``,
``rotary_dim`` (the rotary width is ``int(head_dim * partial_rotary_factor)``),
``sliding_window`` / ``max_window_layers``, ``using_split_qkv_in_self_attention``.
Settings that would change the computation but are not implemented (RoPE scaling, sliding
windows, non-zero dropout, another activation) are refused with :class:`LLaDA2ConfigError`.

Two fields are DARE additions that the published ``config.json`` lacks: ``mask_token_id`` and
``eos_token_id`` (defaults: the published code's ``mask_id=156895`` and ``eos_id=156892``); a
checkpoint written by DARE stores the ids of its own tokenizer there.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from dare_core.api import DareError
from dare_nn import layers

__all__ = ["LLaDA2MoeConfig", "LLaDA2ConfigError", "SUPPORTED_ATTN_IMPLEMENTATIONS"]

SUPPORTED_ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


class LLaDA2ConfigError(DareError, ValueError):
    """An LLaDA2 configuration this implementation does not support or that is inconsistent."""


class LLaDA2MoeConfig(PretrainedConfig):
    """LLaDA2-MoE configuration; defaults are LLaDA2.0-mini's ``config.json``."""

    model_type = "llada2_moe"
    keys_to_ignore_at_inference = ["past_key_values"]

    # --- shape -------------------------------------------------------------------------------
    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int | None = 5120
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int | None = 128
    hidden_act: str = "silu"
    # --- attention / norms -------------------------------------------------------------------
    use_qkv_bias: bool = False
    use_qk_norm: bool = True
    use_bias: bool = False
    rms_norm_eps: float = 1e-6
    norm_head: bool = False
    norm_softmax: bool = False
    use_rmsnorm: bool = True
    using_split_qkv_in_self_attention: bool = False
    # --- positions ---------------------------------------------------------------------------
    max_position_embeddings: int = 32768
    rope_theta: float = 600000.0
    rope_scaling: dict | None = None
    partial_rotary_factor: float = 0.5
    rotary_dim: int | None = 64
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    # --- MoE ---------------------------------------------------------------------------------
    num_experts: int | None = 256
    num_shared_experts: int | None = 1
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    moe_intermediate_size: int | None = 512
    first_k_dense_replace: int = 1
    score_function: str = "sigmoid"
    norm_topk_prob: bool = True
    router_dtype: str = "fp32"
    moe_router_enable_expert_bias: bool = True
    output_router_logits: bool = False
    # --- dropout (all 0.0 in the published configs; anything else is refused) -----------------
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    output_dropout: float = 0.0
    # --- init / embeddings -------------------------------------------------------------------
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    # --- tokens / runtime --------------------------------------------------------------------
    pad_token_id: int | None = 156892
    eos_token_id: int | list[int] | None = 156892
    bos_token_id: int | None = None
    mask_token_id: int | None = 156895
    use_cache: bool = False

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**layers.attn_implementation_kwargs(kwargs))
        if self.architectures is None:
            self.architectures = ["LLaDA2MoeModelLM"]
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.check_supported()

    # ------------------------------------------------------------------ derived sizes
    @property
    def rope_dim(self) -> int:
        """Number of leading head dimensions that rotate: ``int(head_dim * partial_rotary_factor)``."""
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Layers ``>= first_k_dense_replace`` are MoE (when ``num_experts`` is set)."""
        return self.num_experts is not None and layer_idx >= self.first_k_dense_replace

    # ------------------------------------------------------------------ validation
    def check_supported(self) -> None:
        """Raise :class:`LLaDA2ConfigError` for a setting this implementation does not honour."""

        bad = layers.config_error("LLaDA2MoeConfig", LLaDA2ConfigError)
        layers.check_positive_ints(
            self,
            (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
            ),
            bad,
        )
        layers.check_heads(self.num_attention_heads, self.num_key_value_heads, bad)
        if not 0.0 < float(self.partial_rotary_factor) <= 1.0:
            bad(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor!r}")
        if self.rope_dim < 2 or self.rope_dim % 2:
            bad(f"int(head_dim * partial_rotary_factor) = {self.rope_dim} must be a positive even number")
        if self.rope_scaling is not None:
            bad("rope_scaling is not supported (the published checkpoints use none); set it to null")
        if self.use_sliding_window:
            bad("use_sliding_window=True is not supported; set it to false")
        if self.hidden_act != "silu":
            bad(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")
        if self.score_function != "sigmoid":
            bad(
                f"score_function={self.score_function!r} is not supported: the published router is "
                f"always sigmoid; set it to 'sigmoid'"
            )
        layers.check_no_dropout(self, ("embedding_dropout", "attention_dropout", "output_dropout"), bad)
        if self.tie_word_embeddings:
            bad("tie_word_embeddings=True is not supported (LLaDA2 has an untied lm_head)")
        if self.first_k_dense_replace < 0:
            bad(f"first_k_dense_replace must be >= 0, got {self.first_k_dense_replace}")
        if self.first_k_dense_replace > 0 or self.num_experts is None:
            if not self.intermediate_size or self.intermediate_size <= 0:
                bad("intermediate_size must be a positive int when some layer is dense")
        if self.num_experts is not None:
            e, g = self.num_experts, self.n_group
            if e <= 0 or g <= 0 or e % g:
                bad(f"num_experts ({e}) must be a positive multiple of n_group ({g})")
            if e // g < 2:
                bad(
                    f"every expert group needs at least 2 experts (group score = sum of the top 2); "
                    f"num_experts / n_group = {e // g}"
                )
            if not 0 < self.topk_group <= g:
                bad(f"topk_group ({self.topk_group}) must be in 1..n_group ({g})")
            if not 0 < self.num_experts_per_tok <= self.topk_group * (e // g):
                bad(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..topk_group * "
                    f"experts per group = {self.topk_group * (e // g)}"
                )
            if not self.moe_intermediate_size or self.moe_intermediate_size <= 0:
                bad("moe_intermediate_size must be a positive int for MoE layers")
            if self.num_shared_experts is not None and self.num_shared_experts < 0:
                bad(f"num_shared_experts must be null or >= 0, got {self.num_shared_experts}")
        layers.check_attn_implementation(self, SUPPORTED_ATTN_IMPLEMENTATIONS, bad)
