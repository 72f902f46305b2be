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

__all__ = ["SDARConfig", "SDARMoeConfig", "SUPPORTED_ATTN_IMPLEMENTATIONS"]

SUPPORTED_ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


def _check_common(cfg: PretrainedConfig, name: str) -> None:
    def bad(msg: str) -> None:
        raise ValueError(f"{name}: {msg}")

    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            bad(f"{field} must be a positive int, got {value!r}")
    if cfg.head_dim % 2:
        bad(f"head_dim ({cfg.head_dim}) must be even for rotary embeddings")
    kv = cfg.num_key_value_heads
    if not isinstance(kv, int) or kv <= 0 or cfg.num_attention_heads % kv:
        bad(f"num_key_value_heads ({kv}) must be a positive divisor of num_attention_heads "
            f"({cfg.num_attention_heads})")
    if cfg.hidden_act != "silu":
        bad(f"hidden_act={cfg.hidden_act!r} is not supported (SDAR uses 'silu')")
    if cfg.attention_bias:
        bad("attention_bias=True is not supported (SDAR has no projection biases)")
    if cfg.rope_scaling not in (None, {}):
        bad(f"rope_scaling={cfg.rope_scaling!r} is not supported (SDAR checkpoints use none)")
    if cfg.use_sliding_window:
        bad("use_sliding_window=True is not supported (SDAR checkpoints use full attention)")
    if cfg.attention_dropout:
        bad(f"attention_dropout={cfg.attention_dropout!r} is not supported (use 0.0)")
    if cfg.tie_word_embeddings:
        bad("tie_word_embeddings=True is not supported (SDAR has an untied LM head)")
    if not (isinstance(cfg.rope_theta, (int, float)) and cfg.rope_theta > 0):
        bad(f"rope_theta must be a positive number, got {cfg.rope_theta!r}")
    bsz = getattr(cfg, "block_size", None)
    if bsz is not None and (not isinstance(bsz, int) or bsz <= 0):
        bad(f"block_size must be a positive int, got {bsz!r}")
    attn = cfg._attn_implementation
    if attn is not None and attn not in SUPPORTED_ATTN_IMPLEMENTATIONS:
        bad(f"attn_implementation={attn!r} is not supported (choose from {SUPPORTED_ATTN_IMPLEMENTATIONS})")


class _SDARBase(PretrainedConfig):
    keys_to_ignore_at_inference = ["past_key_values"]

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

    vocab_size: int = 151936
    hidden_size: int = 2560
    intermediate_size: int = 9728
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = False
    tie_word_embeddings: bool = False
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int = 36
    attention_dropout: float = 0.0
    block_size: int | None = 4
    mask_token_id: int | None = 151669
    fuse_cross_entropy: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151643

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

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 48
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 4
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    tie_word_embeddings: bool = False
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int = 48
    attention_dropout: float = 0.0
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
    pad_token_id: int | None = None
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151643

    def __post_init__(self, **kwargs: Any) -> None:
        if self.mlp_only_layers is None:
            self.mlp_only_layers = []
        super().__post_init__(**kwargs)
        self.check_supported()

    def check_supported(self) -> None:
        _check_common(self, "SDARMoeConfig")
        for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SDARMoeConfig: {field} must be a positive int, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"SDARMoeConfig: num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                             f"num_experts ({self.num_experts})")

    def is_moe_layer(self, layer_idx: int) -> bool:
        """The published rule: MoE unless listed in ``mlp_only_layers``, every ``decoder_sparse_step``."""
        return (layer_idx not in self.mlp_only_layers and self.num_experts > 0
                and (layer_idx + 1) % self.decoder_sparse_step == 0)
