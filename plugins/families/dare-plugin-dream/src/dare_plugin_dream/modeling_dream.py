"""Native (no ``trust_remote_code``) implementation of Dream for transformers 5.x.

Dream is the Qwen2 architecture used bidirectionally. Parameter names are exactly those of the
published checkpoints::

    model.embed_tokens.weight                             [V, d]
    model.layers.{i}.input_layernorm.weight               [d]
    model.layers.{i}.self_attn.q_proj.{weight,bias}       [H*hd, d], [H*hd]
    model.layers.{i}.self_attn.k_proj.{weight,bias}       [KV*hd, d], [KV*hd]
    model.layers.{i}.self_attn.v_proj.{weight,bias}       [KV*hd, d], [KV*hd]
    model.layers.{i}.self_attn.o_proj.weight              [d, H*hd]   (no bias)
    model.layers.{i}.post_attention_layernorm.weight      [d]
    model.layers.{i}.mlp.{gate,up}_proj.weight            [m, d]
    model.layers.{i}.mlp.down_proj.weight                 [d, m]
    model.norm.weight                                     [d]
    lm_head.weight                                        [V, d]      (untied unless tie_word_embeddings)

Semantics (those of the published ``modeling_dream.py``): pre-norm block
``h = x + o_proj(Attn(RMS(x)))``, ``out = h + down(silu(gate(RMS(h))) * up(RMS(h)))``; RMSNorm
normalises in fp32, casts back, then multiplies by the weight; NeoX rotate-half RoPE whose
cos/sin are computed in fp32 and cast to the activation dtype; GQA by repeating k/v heads;
softmax scale ``1/sqrt(head_dim)``; attention is never causal; the embedding's ``padding_idx``
is ``pad_token_id`` (that row starts at zero and receives no gradient).

The logits are **not** shifted here: like Qwen's, ``logits[:, i]`` is the model's prediction for
the token at position ``i + 1``. The DARE wrapper (``wrapper.py``) aligns them.

Beyond the published code (shared DARE contracts):

* ``attention_mask`` may be a 2-D key-padding mask (the published SDPA path rejects it), a 4-D
  boolean (True = may attend) or additive mask, ``None`` or the string ``"full"``;
* a KV cache: ``past_key_values`` is a list with one ``(k, v)`` per layer, ``[B, KV, P, hd]``,
  keys after RoPE; with a cache ``attention_mask`` is a bool ``[B, 1, Q, P+Q]`` or a 2-D
  ``[B, P+Q]`` key mask, and ``use_cache=True`` returns ``past_key_values`` of length ``P+Q``;
* ``forward_hidden`` (final norm applied, no head) and ``get_output_embeddings``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from dare_nn import layers

from .configuration_dream import DreamConfig

__all__ = [
    "DreamRMSNorm",
    "DreamAttention",
    "DreamMLP",
    "DreamDecoderLayer",
    "DreamBaseModel",
    "DreamPreTrainedModel",
    "DreamModel",
    "DreamOutput",
    "rotary_cos_sin",
    "apply_rotary",
    "prepare_attention_mask",
]

# Arguments of the original code (or of HF training loops) that would change the result if they
# were honoured; refusing them is safer than silently computing something else.
_REJECTED_IF_SET = (
    "labels",
    "cu_seqlens",
    "max_seqlen",
    "replace_position",
    "dual_cache",
    "cache_position",
    "num_logits_to_keep",
    "logits_to_keep",
    "output_attentions",
)

KVCache = Sequence[tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass
class DreamOutput(ModelOutput):
    """``logits``, the KV cache (a list of ``(k, v)`` per layer) and ``hidden_states``; the cache
    is readable as ``.cache`` (the newer transformers name) or ``.past_key_values`` (the DARE
    contract) under every transformers release."""

    logits: Optional[torch.Tensor] = None
    cache: Optional[Any] = None
    hidden_states: Optional[tuple] = None

    @property
    def past_key_values(self):
        return self.cache


# RoPE cos/sin computed in fp32 and cast to the activation dtype, applied in it; masks: None /
# "full" / 2-D key padding / 4-D bool or additive (the shared primitives, re-exported).
rotary_cos_sin = layers.rotary_cos_sin
apply_rotary = layers.apply_rotary
prepare_attention_mask = layers.prepare_attention_mask


class DreamRMSNorm(layers.RMSNorm):
    """RMSNorm: normalise in fp32, cast back to the input dtype, then scale."""


# ---------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------
class DreamAttention(nn.Module):
    """Bidirectional GQA self-attention with q/k/v biases (o_proj has none).

    RoPE cos/sin arrive in the activation dtype and rotate in it; the eager path forms the scores
    in the activation dtype and takes the softmax in fp32 (the published code).
    """

    def __init__(self, config: DreamConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        d = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = d // self.num_heads
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(d, self.num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(d, self.num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Optional[torch.Tensor],
        past: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        q = layers.apply_rotary(layers.split_heads(self.q_proj(x), self.num_heads, self.head_dim), cos, sin)
        k = layers.apply_rotary(layers.split_heads(self.k_proj(x), self.num_key_value_heads, self.head_dim), cos, sin)
        v = layers.split_heads(self.v_proj(x), self.num_key_value_heads, self.head_dim)
        out, present = layers.attend(
            q,
            k,
            v,
            mask,
            scale=1.0 / math.sqrt(self.head_dim),
            past=past,
            implementation=self.config._attn_implementation,
        )
        return self.o_proj(out), present


class DreamMLP(layers.SwiGLU):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DreamConfig) -> None:
        super().__init__(config.hidden_size, config.intermediate_size)


class DreamDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm Qwen2 block, bidirectional."""

    def __init__(self, config: DreamConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = DreamAttention(config, layer_idx)
        self.mlp = DreamMLP(config)
        self.input_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        past: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        *,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, Optional[tuple[torch.Tensor, torch.Tensor]]]:
        """``(output, (k, v))`` of one layer; ``(output, None)`` without ``use_cache``."""
        return layers.pre_norm_residual(
            hidden_states,
            self.input_layernorm,
            self.self_attn,
            self.post_attention_layernorm,
            self.mlp,
            cos,
            sin,
            attention_mask,
            past,
            keep_present=use_cache,
        )


class DreamBaseModel(nn.Module):
    """``embed_tokens``, ``layers``, ``norm`` (the published ``model.*`` names)."""

    def __init__(self, config: DreamConfig) -> None:
        super().__init__()
        self.config = config
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(DreamDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Any = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Optional[KVCache] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        output_hidden_states: bool = False,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, Optional[tuple[torch.Tensor, ...]], Optional[KVCache]]:
        """``(final-norm hidden, hidden states or None, per-layer (k, v) or None without use_cache)``."""
        cfg = self.config
        x, past, past_len, position_ids = layers.decoder_inputs(
            self.embed_tokens,
            input_ids,
            inputs_embeds,
            position_ids,
            past_key_values,
            n_layers=len(self.layers),
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
        )
        bsz, length, _ = x.shape
        cos, sin = layers.rotary_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta, x.dtype)
        mask = layers.prepare_attention_mask(attention_mask, bsz, length, past_len + length, cfg.num_attention_heads)
        if mask is not None:
            mask = mask.to(x.device)
        return layers.run_layers(
            self.layers,
            x,
            cos,
            sin,
            mask,
            past=past,
            final_norm=self.norm,
            output_hidden_states=output_hidden_states,
            use_cache=use_cache,
        )


class DreamPreTrainedModel(layers.NativeModelDefaults, PreTrainedModel):
    config_class = DreamConfig
    _no_split_modules = ["DreamDecoderLayer"]


class DreamModel(layers.EmbeddingAccessors, DreamPreTrainedModel):
    """Dream masked-diffusion LM. ``forward`` returns the raw (AR-aligned) logits ``[B, L, V]``:
    ``logits[:, i]`` predicts the token at position ``i + 1``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: DreamConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    # get/set_{input,output}_embeddings
    input_embeddings_path = "model.embed_tokens"
    output_embeddings_path = "lm_head"

    def forward_hidden(
        self, input_ids: torch.Tensor, attention_mask: Any = None, position_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Final hidden states ``[B, L, d]`` (final norm applied, LM head not applied)."""
        hidden, _, _ = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        return hidden

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Any = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Optional[KVCache] = None,
        use_cache: bool | None = False,
        inputs_embeds: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ) -> DreamOutput | tuple:
        """Bidirectional forward.

        Args:
            input_ids: ``[B, L]`` (or ``inputs_embeds`` ``[B, L, d]``).
            attention_mask: ``None`` / ``"full"``; 2-D ``[B, P+L]`` 0/1 key-padding mask; 4-D bool
                ``[B, 1, L, P+L]`` (True = may attend) or 4-D additive float mask.
            position_ids: ``[B, L]`` / ``[L]`` RoPE positions (default ``P .. P+L-1``).
            past_key_values: ``None`` or one ``(k, v)`` per layer, ``[B, KV, P, hd]``, keys after
                RoPE; the new tokens attend to the cache and to each other.
            use_cache: return ``past_key_values`` (cache then new tokens, length ``P+L``).
        """
        layers.reject_options("DreamModel", kwargs, _REJECTED_IF_SET)
        if output_hidden_states is None:
            output_hidden_states = bool(self.config.output_hidden_states)
        if return_dict is None:
            return_dict = self.config.return_dict if self.config.return_dict is not None else True
        hidden, all_hidden, presents = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            use_cache=bool(use_cache),
        )
        logits = self.lm_head(hidden)
        cache = presents
        if not return_dict:
            return tuple(v for v in (logits, cache, all_hidden) if v is not None)
        return DreamOutput(logits=logits, cache=cache, hidden_states=all_hidden)
