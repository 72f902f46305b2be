"""Configurations of the native SDAR (``sdar``) and SDAR-MoE (``sdar_moe``) implementations.

Field names are those of the published ``config.json`` files (SDAR-1.7B/4B/8B-Chat and
SDAR-30B-A3B-Chat: Qwen3 / Qwen3-MoE fields plus ``block_size`` and ``mask_token_id``), so a
published config loads unchanged and a config saved here is readable by the published code.
``rope_theta`` / ``rope_scaling`` keep their published names. Settings this implementation does not
honour (RoPE scaling, sliding windows, attention bias, dropout) are rejected with a ``ValueError``
instead of being silently ignored.

Fields that only drive the published training kernels (``fuse_cross_entropy``, ``attn_implementation
"flex_attention"``, ``micro_forward``, ``use_deepep``, ``ep_size`` ...) are kept as plain attributes
and have no effect; the attention kernel is chosen with the standard ``attn_implementation``
(``sdpa`` default, or ``eager``).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from dare_nn import layers

__all__ = ["SDARConfig", "SDARMoeConfig", "SUPPORTED_ATTN_IMPLEMENTATIONS"]

SUPPORTED_ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


def _check_common(cfg: PretrainedConfig, name: str) -> None:
    bad = layers.config_error(name)
    layers.check_positive_ints(
        cfg, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim"), bad
    )
    layers.check_heads(cfg.num_attention_heads, cfg.num_key_value_heads, bad, rotary_dim=cfg.head_dim)
    if cfg.hidden_act != "silu":
        bad(f"hidden_act={cfg.hidden_act!r} is not supported (SDAR uses 'silu')")
    if cfg.attention_bias:
        bad("attention_bias=True is not supported (SDAR has no projection biases)")
    if cfg.rope_scaling not in (None, {}):
        bad(f"rope_scaling={cfg.rope_scaling!r} is not supported (SDAR checkpoints use none)")
    if cfg.use_sliding_window:
        bad("use_sliding_window=True is not supported (SDAR checkpoints use full attention)")
    layers.check_no_dropout(cfg, ("attention_dropout",), bad)
    if cfg.tie_word_embeddings:
        bad("tie_word_embeddings=True is not supported (SDAR has an untied LM head)")
    layers.check_rope_theta(cfg.rope_theta, bad)
    bsz = getattr(cfg, "block_size", None)
    if bsz is not None and (not isinstance(bsz, int) or bsz <= 0):
        bad(f"block_size must be a positive int, got {bsz!r}")
    layers.check_attn_implementation(cfg, SUPPORTED_ATTN_IMPLEMENTATIONS, bad)


class _SDARBase(PretrainedConfig):
    """Fields and defaults the dense and MoE configs share (Qwen3 names); each subclass declares
    the ones whose published defaults differ, and its own."""

    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 151936
    num_attention_heads: int = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = None
    attention_dropout: float = 0.0
    pad_token_id: int | None = None
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151643

    def __post_init__(self, **kwargs: Any) -> None:
        # The published dense config.json carries "attn_implementation": "flex_attention" for its
        # training kernels; it is not a kernel choice here.
        published = kwargs.get("attn_implementation")
        if published == "flex_attention":
            kwargs.pop("attn_implementation")
            self.published_attn_implementation = published
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)
        if self.architectures is None:
            self.architectures = [self.default_architecture]

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        published = out.pop("published_attn_implementation", None)
        if published is not None:
            out["attn_implementation"] = published
        return out


class SDARConfig(_SDARBase):
    """SDAR dense (Qwen3 + block diffusion); defaults are SDAR-4B-Chat's."""

    model_type = "sdar"
    default_architecture = "SDARForCausalLM"

    hidden_size: int = 2560
    intermediate_size: int = 9728
    num_hidden_layers: int = 36
    num_key_value_heads: int | None = 8
    use_cache: bool = False
    max_window_layers: int = 36
    block_size: int | None = 4
    mask_token_id: int | None = 151669
    fuse_cross_entropy: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        _check_common(self, "SDARConfig")

    def check_supported(self) -> None:
        _check_common(self, "SDARConfig")


class SDARMoeConfig(_SDARBase):
    """SDAR-MoE (Qwen3-MoE + block diffusion); defaults are SDAR-30B-A3B-Chat's.

    The published config has no ``block_size`` / ``mask_token_id``: ``None`` here, and the model
    wrapper falls back to block size 4 and the tokenizer's mask token, as the published generation
    code does.
    """

    model_type = "sdar_moe"
    default_architecture = "SDARMoeForCausalLM"

    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 48
    num_key_value_heads: int | None = 4
    use_cache: bool = True
    max_window_layers: int = 48
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 768
    num_experts_per_tok: int = 8
    num_experts: int = 128
    norm_topk_prob: bool = True
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    mlp_only_layers: list[int] | None = None
    block_size: int | None = None
    mask_token_id: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        if self.mlp_only_layers is None:
            self.mlp_only_layers = []
        super().__post_init__(**kwargs)
        self.check_supported()

    def check_supported(self) -> None:
        _check_common(self, "SDARMoeConfig")
        layers.check_positive_ints(
            self,
            ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"),
            layers.config_error("SDARMoeConfig"),
        )
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"SDARMoeConfig: num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                f"num_experts ({self.num_experts})"
            )

    def is_moe_layer(self, layer_idx: int) -> bool:
        """The published rule: MoE unless listed in ``mlp_only_layers``, every ``decoder_sparse_step``."""
        return (
            layer_idx not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )
