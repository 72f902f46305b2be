"""Configuration of the native LLaDA implementation.

Field names follow the OLMo-style ``config.json`` published with
LLaDA-8B-Instruct, and the defaults are that checkpoint's values, so a
published config loads unchanged and a config saved here is readable by the
original remote code.

Only the subset of OLMo options that LLaDA checkpoints use is implemented.
Every other setting is rejected with a ``ValueError`` instead of being
silently ignored (see :meth:`LLaDAConfig.check_supported`).

transformers 5.x notes
----------------------
* ``PreTrainedConfig`` is a dataclass; fields are declared as annotated class
  attributes and validation happens in ``__post_init__``.  Unknown keys from a
  ``config.json`` (``auto_map``, ``init_device`` ...) are kept as plain
  attributes by the base class.
* The base class no longer defines ``use_cache`` or the special token ids, so
  they are declared here.  ``tie_word_embeddings`` is an alias of
  ``weight_tying`` (via ``attribute_map``); the model never ties weights.
* The attention implementation is chosen with the standard
  ``attn_implementation`` mechanism (``LLaDAConfig(attn_implementation=...)``,
  ``from_pretrained(..., attn_implementation=...)`` or
  ``model.set_attn_implementation(...)``), stored in
  ``config._attn_implementation``.  ``"sdpa"`` (default) and ``"eager"`` are
  supported.  The published ``flash_attention`` / ``flash_attn_varlen``
  flags are kept for compatibility only and do not select a kernel.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from dare_nn import layers

__all__ = ["LLaDAConfig", "SUPPORTED_ATTN_IMPLEMENTATIONS"]

SUPPORTED_ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


class LLaDAConfig(PretrainedConfig):
    """LLaDA (OLMo-style) configuration; defaults are LLaDA-8B-Instruct's."""

    model_type = "llada"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {"tie_word_embeddings": "weight_tying"}

    # --- shape -----------------------------------------------------------
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = 32
    n_layers: int = 32
    mlp_ratio: int = 4
    mlp_hidden_size: int | None = 12288
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    max_sequence_length: int = 4096
    # --- block -----------------------------------------------------------
    activation_type: str = "silu"
    block_type: str = "llama"
    block_group_size: int = 1
    layer_norm_type: str = "rms"
    layer_norm_with_affine: bool = True
    rms_norm_eps: float = 1e-5
    bias_for_layer_norm: bool | None = False
    include_bias: bool = False
    include_qkv_bias: bool | None = False
    attention_layer_norm: bool = False
    attention_layer_norm_with_affine: bool = True
    multi_query_attention: bool | None = None
    # --- positions -------------------------------------------------------
    rope: bool = True
    rope_theta: float = 500000.0
    rope_full_precision: bool = True
    alibi: bool = False
    alibi_bias_max: float = 8.0
    # --- embeddings / head -----------------------------------------------
    weight_tying: bool = False
    scale_logits: bool = False
    input_emb_norm: bool = False
    # --- dropout (LLaDA ships 0.0; anything else is rejected) --------------
    attention_dropout: float = 0.0
    residual_dropout: float = 0.0
    embedding_dropout: float = 0.0
    # --- kernels (informational, see module docstring) -------------------
    flash_attention: bool = True
    flash_attn_varlen: bool = True
    # --- init ------------------------------------------------------------
    init_fn: str = "mitchell"
    init_std: float = 0.02
    init_cutoff_factor: float | None = None
    init_device: str | None = None
    precision: str | None = "amp_bf16"
    # --- tokens / runtime ------------------------------------------------
    mask_token_id: int | None = 126336
    pad_token_id: int | None = 126081
    eos_token_id: int | list[int] | None = 126081
    bos_token_id: int | None = 126080
    use_cache: bool = False

    def __post_init__(self, **kwargs: Any) -> None:
        # BC: older configs could pass the attention choice under the private name.
        super().__post_init__(**layers.attn_implementation_kwargs(kwargs))
        if self.architectures is None:
            self.architectures = ["LLaDAModelLM"]
        self.check_supported()

    # ------------------------------------------------------------------
    # HF-standard read-only aliases
    # ------------------------------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_key_value_heads(self) -> int:
        return self.effective_n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def intermediate_size(self) -> int:
        return self.effective_mlp_hidden_size

    @property
    def max_position_embeddings(self) -> int:
        return self.max_sequence_length

    # ------------------------------------------------------------------
    # Derived sizes
    # ------------------------------------------------------------------
    @property
    def effective_n_kv_heads(self) -> int:
        if self.n_kv_heads is None:
            return 1 if self.multi_query_attention else self.n_heads
        return self.n_kv_heads

    @property
    def effective_mlp_hidden_size(self) -> int:
        if self.mlp_hidden_size is not None:
            return self.mlp_hidden_size
        return self.mlp_ratio * self.d_model

    @property
    def effective_embedding_size(self) -> int:
        """Rows of ``wte`` / ``ff_out`` (and the logits' last dimension)."""
        return self.embedding_size if self.embedding_size is not None else self.vocab_size

    # ------------------------------------------------------------------
    # Validation
    # ------------------------------------------------------------------
    def check_supported(self) -> None:
        """Raise ``ValueError`` for any setting this implementation does not honour."""

        bad = layers.config_error("LLaDAConfig")
        layers.check_positive_ints(self, ("d_model", "n_heads", "n_layers", "vocab_size"), bad)
        if self.d_model % self.n_heads != 0:
            bad(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_kv_heads is not None and self.multi_query_attention is not None:
            expected = 1 if self.multi_query_attention else self.n_heads
            if self.n_kv_heads != expected:
                bad("multi_query_attention and n_kv_heads are inconsistent")
        layers.check_heads(
            self.n_heads,
            self.effective_n_kv_heads,
            bad,
            rotary_dim=self.d_model // self.n_heads,
            names=("n_kv_heads", "n_heads"),
        )
        if self.effective_mlp_hidden_size <= 0:
            bad("mlp_hidden_size / mlp_ratio must give a positive MLP width")
        if self.effective_embedding_size < self.vocab_size:
            bad(f"embedding_size ({self.embedding_size}) must be >= vocab_size ({self.vocab_size})")
        if self.block_type != "llama":
            bad(f"block_type={self.block_type!r} is not supported (only 'llama')")
        if self.activation_type != "silu":
            bad(f"activation_type={self.activation_type!r} is not supported (only 'silu', the SwiGLU llama block)")
        if self.block_group_size != 1:
            bad("block_group_size != 1 is not supported (it changes parameter names)")
        if self.layer_norm_type != "rms":
            bad(f"layer_norm_type={self.layer_norm_type!r} is not supported (only 'rms')")
        if not self.layer_norm_with_affine:
            bad("layer_norm_with_affine=False is not supported")
        if self.bias_for_layer_norm:
            bad("bias_for_layer_norm=True is not supported")
        if self.bias_for_layer_norm is None and self.include_bias:
            bad("bias_for_layer_norm=None inherits include_bias=True, which is not supported")
        if self.include_bias:
            bad("include_bias=True is not supported")
        if self.attention_layer_norm:
            bad("attention_layer_norm=True (q/k norm) is not supported")
        if self.alibi:
            bad("alibi=True is not supported")
        if not self.rope:
            bad("rope=False is not supported")
        layers.check_rope_theta(self.rope_theta, bad)
        if self.weight_tying:
            bad("weight_tying=True is not supported (LLaDA has an untied LM head)")
        if self.input_emb_norm:
            bad("input_emb_norm=True is not supported")
        layers.check_no_dropout(self, ("attention_dropout", "residual_dropout", "embedding_dropout"), bad)
        layers.check_attn_implementation(self, SUPPORTED_ATTN_IMPLEMENTATIONS, bad)
