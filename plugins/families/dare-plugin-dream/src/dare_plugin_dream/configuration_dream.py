"""Configuration of the native Dream implementation.

Field names are those of the ``config.json`` published with Dream-v0-Instruct-7B (Qwen2 names:
``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``rope_theta``, ``rms_norm_eps``, ``tie_word_embeddings``,
``mask_token_id`` ...) and the defaults are that checkpoint's values, so a published config
loads unchanged and a config saved here is readable by the original remote code.

Settings this implementation does not honour (rope scaling, sliding windows, dropout,
an activation other than silu) raise ``ValueError`` instead of being ignored.

The attention kernel is chosen with the standard ``attn_implementation`` mechanism
(``"sdpa"``, the default, or ``"eager"``). The published config names
``"flash_attention_2"``; loading such a config selects ``"sdpa"`` (the same mathematics) since
flash-attn is not a dependency here.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from dare_nn import layers

__all__ = ["DreamConfig", "SUPPORTED_ATTN_IMPLEMENTATIONS"]

SUPPORTED_ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
# kernels of the published code that compute the same function as one of ours
_EQUIVALENT_ATTN = {"flash_attention_2": "sdpa"}


class DreamConfig(PretrainedConfig):
    """Dream configuration; defaults are Dream-v0-Instruct-7B's."""

    model_type = "Dream"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int | None = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = False
    tie_word_embeddings: bool = False
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int = 28
    attention_dropout: float = 0.0
    mask_token_id: int | None = 151666
    pad_token_id: int | None = 151643
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151643

    def __post_init__(self, **kwargs: Any) -> None:
        kwargs = layers.attn_implementation_kwargs(kwargs, _EQUIVALENT_ATTN)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)
        if self.architectures is None:
            self.architectures = ["DreamModel"]
        self.check_supported()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def check_supported(self) -> None:
        """Raise ``ValueError`` for any setting this implementation does not honour."""

        bad = layers.config_error("DreamConfig")
        layers.check_positive_ints(
            self,
            (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            ),
            bad,
        )
        if self.hidden_size % self.num_attention_heads:
            bad(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        layers.check_heads(self.num_attention_heads, self.num_key_value_heads, bad, rotary_dim=self.head_dim)
        if self.hidden_act != "silu":
            bad(f"hidden_act={self.hidden_act!r} is not supported (only 'silu', the SwiGLU MLP)")
        if self.rope_scaling is not None:
            bad(f"rope_scaling={self.rope_scaling!r} is not supported (Dream uses plain RoPE; set null)")
        layers.check_rope_theta(self.rope_theta, bad)
        if self.use_sliding_window:
            bad("use_sliding_window=True is not supported (Dream attends over the whole sequence)")
        layers.check_no_dropout(self, ("attention_dropout",), bad)
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            bad(f"pad_token_id ({self.pad_token_id}) must be a row of the embedding (< vocab_size {self.vocab_size})")
        layers.check_attn_implementation(self, SUPPORTED_ATTN_IMPLEMENTATIONS, bad)
