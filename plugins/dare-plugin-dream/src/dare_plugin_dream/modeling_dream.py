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

import math
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as hf_init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_dream import SUPPORTED_ATTN_IMPLEMENTATIONS, DreamConfig

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
_REJECTED_IF_SET = ("labels", "cu_seqlens", "max_seqlen", "replace_position", "dual_cache",
                    "cache_position", "num_logits_to_keep", "logits_to_keep")

KVCache = Sequence[tuple[torch.Tensor, torch.Tensor]]


class DreamOutput(CausalLMOutputWithPast):
    """``logits``, ``hidden_states`` and the KV cache (a list of ``(k, v)`` per layer), readable
    as ``.past_key_values`` (the shared DARE contract) or ``.cache`` (transformers 5 name)."""

    @property
    def past_key_values(self):  # the base class warns that the name is deprecated
        return self.cache


class DreamRMSNorm(nn.Module):
    """RMSNorm: normalise in fp32, cast back to the input dtype, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


# ---------------------------------------------------------------------------
# Rotary embeddings
# ---------------------------------------------------------------------------
def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, 1, L, head_dim]`` for ``position_ids`` ``[B, L]``.

    Angles ``pos * theta ** (-2j / head_dim)`` are computed in fp32 (both halves of the head use
    the same frequencies, NeoX layout), then cos/sin are cast to ``dtype``.
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device).float() / head_dim
    inv_freq = 1.0 / (float(theta) ** exponent)
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        angles = position_ids.float()[..., None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, L, hd]`` in its own dtype (cos/sin already cast to it)."""
    return x * cos + _rotate_half(x) * sin


# ---------------------------------------------------------------------------
# Attention masks
# ---------------------------------------------------------------------------
def prepare_attention_mask(attention_mask: Any, batch: int, queries: int, keys: int,
                           n_heads: int) -> Optional[torch.Tensor]:
    """Normalise ``attention_mask`` to ``None`` or a 4-D tensor for the attention kernels.

    * ``None`` or ``"full"`` -> ``None`` (every query sees every key);
    * 2-D ``[B, keys]`` 0/1 (or bool) key-padding mask -> ``None`` when all ones, else bool
      ``[B, 1, 1, keys]`` (True = key may be attended);
    * 4-D bool (True = may attend) or floating additive mask broadcastable to
      ``[B, n_heads, queries, keys]`` -> unchanged;
    * anything else -> ``ValueError``.
    """
    if attention_mask is None or (isinstance(attention_mask, str) and attention_mask == "full"):
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a tensor, None or 'full', got {attention_mask!r}")
    m = attention_mask
    if m.dim() == 2:
        if tuple(m.shape) != (batch, keys):
            raise ValueError(f"2-D attention_mask must have shape {(batch, keys)}, got {tuple(m.shape)}")
        if m.dtype == torch.bool:
            keep = m
        else:
            if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
                raise ValueError("2-D attention_mask must be a 0/1 key-padding mask; pass additive masks as 4-D")
            keep = m != 0
        if bool(keep.all()):
            return None
        return keep[:, None, None, :]
    if m.dim() == 4:
        if not (m.dtype == torch.bool or m.is_floating_point()):
            raise ValueError(f"4-D attention_mask must be bool or floating (additive), got {m.dtype}")
        b, h, q, k = m.shape
        if b not in (1, batch) or h not in (1, n_heads) or q not in (1, queries) or k != keys:
            raise ValueError(f"4-D attention_mask of shape {tuple(m.shape)} does not broadcast to "
                             f"{(batch, n_heads, queries, keys)}")
        return m
    raise ValueError(f"attention_mask must be None, 'full', 2-D [B, K] or 4-D [B, 1, Q, K]; got {m.dim()}-D")


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, KV, L, hd] -> [B, KV*groups, L, hd]; query head h uses kv head h // groups."""
    if groups == 1:
        return x
    b, kv, length, hd = x.shape
    return x[:, :, None].expand(b, kv, groups, length, hd).reshape(b, kv * groups, length, hd)


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                     scale: float) -> torch.Tensor:
    """Scores in the activation dtype, additive mask, softmax in fp32 cast back (the published
    eager path); queries that may attend to nothing output zeros (as torch SDPA does)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    dead = None
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
            dead = ~mask.any(dim=-1, keepdim=True)
        else:
            scores = scores + mask.to(scores.dtype)
            dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if dead is not None:
        probs = probs.masked_fill(dead, 0.0)
    return torch.matmul(probs.to(q.dtype), v)


def _sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                    scale: float) -> torch.Tensor:
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)


# ---------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------
class DreamAttention(nn.Module):
    """Bidirectional GQA self-attention with q/k/v biases (o_proj has none)."""

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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Optional[torch.Tensor],
                past: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        bsz, length, _ = x.shape
        q = self.q_proj(x).view(bsz, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if past is not None:
            k = torch.cat([past[0].to(k.dtype), k], dim=2)
            v = torch.cat([past[1].to(v.dtype), v], dim=2)
        present = (k, v)
        groups = self.num_heads // self.num_key_value_heads
        kr, vr = _repeat_kv(k, groups), _repeat_kv(v, groups)
        impl = self.config._attn_implementation or "sdpa"
        scale = 1.0 / math.sqrt(self.head_dim)
        if impl == "sdpa":
            out = _sdpa_attention(q, kr, vr, mask, scale)
        elif impl == "eager":
            out = _eager_attention(q, kr, vr, mask, scale)
        else:
            raise ValueError(f"Dream supports attn_implementation in {SUPPORTED_ATTN_IMPLEMENTATIONS}, got {impl!r}")
        out = out.transpose(1, 2).reshape(bsz, length, self.num_heads * self.head_dim)
        return self.o_proj(out), present


class DreamMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DreamConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm Qwen2 block, bidirectional."""

    def __init__(self, config: DreamConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = DreamAttention(config, layer_idx)
        self.mlp = DreamMLP(config)
        self.input_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None,
                past: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn, present = self.self_attn(self.input_layernorm(hidden_states), cos, sin, attention_mask, past)
        h = hidden_states + attn
        return h + self.mlp(self.post_attention_layernorm(h)), present


class DreamBaseModel(nn.Module):
    """``embed_tokens``, ``layers``, ``norm`` (the published ``model.*`` names)."""

    def __init__(self, config: DreamConfig) -> None:
        super().__init__()
        self.config = config
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(DreamDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Any = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Optional[KVCache] = None,
                inputs_embeds: Optional[torch.Tensor] = None, output_hidden_states: bool = False
                ) -> tuple[torch.Tensor, Optional[tuple[torch.Tensor, ...]], list[tuple[torch.Tensor, torch.Tensor]]]:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if x.dim() != 3:
            raise ValueError(f"expected [B, L] input_ids or [B, L, d] inputs_embeds, got {tuple(x.shape)}")
        bsz, length, _ = x.shape
        past_len = 0
        if past_key_values is not None:
            if len(past_key_values) != len(self.layers):
                raise ValueError(f"past_key_values must hold one (k, v) per layer ({len(self.layers)}), "
                                 f"got {len(past_key_values)}")
            past_len = int(past_key_values[0][0].shape[2])
            for k, v in past_key_values:
                if k.dim() != 4 or k.shape[0] != bsz or k.shape[2] != past_len or k.shape != v.shape:
                    raise ValueError("every cached (k, v) must be [B, n_kv_heads, P, head_dim] with the same P")
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + length, device=x.device)[None].expand(bsz, length)
        else:
            if position_ids.dim() == 1:
                position_ids = position_ids[None]
            if position_ids.dim() != 2 or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, bsz):
                raise ValueError(f"position_ids must have shape [L], [1, L] or [B, L] with L = {length}; "
                                 f"got {tuple(position_ids.shape)}")
            position_ids = position_ids.to(x.device).expand(bsz, length)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        mask = prepare_attention_mask(attention_mask, bsz, length, past_len + length,
                                      self.config.num_attention_heads)
        if mask is not None:
            mask = mask.to(x.device)

        hidden: Optional[list[torch.Tensor]] = [] if output_hidden_states else None
        presents: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, layer in enumerate(self.layers):
            if hidden is not None:
                hidden.append(x)
            past = past_key_values[i] if past_key_values is not None else None
            x, present = layer(x, cos, sin, mask, past)
            presents.append(present)
        x = self.norm(x)
        if hidden is not None:
            hidden.append(x)
        return x, (tuple(hidden) if hidden is not None else None), presents


class DreamPreTrainedModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DreamDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False

    def _init_weights(self, module: nn.Module) -> None:
        std = float(self.config.initializer_range)
        if isinstance(module, nn.Linear):
            hf_init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                hf_init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            hf_init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, DreamRMSNorm):
            hf_init.ones_(module.weight)


class DreamModel(DreamPreTrainedModel):
    """Dream masked-diffusion LM. ``forward`` returns the raw (AR-aligned) logits ``[B, L, V]``:
    ``logits[:, i]`` predicts the token at position ``i + 1``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: DreamConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward_hidden(self, input_ids: torch.Tensor, attention_mask: Any = None,
                       position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Final hidden states ``[B, L, d]`` (final norm applied, LM head not applied)."""
        hidden, _, _ = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        return hidden

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Any = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Optional[KVCache] = None,
                use_cache: bool | None = False, inputs_embeds: Optional[torch.Tensor] = None,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None,
                **kwargs: Any) -> DreamOutput | tuple:
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
        for key in _REJECTED_IF_SET:
            if kwargs.get(key) is not None:
                raise ValueError(f"DreamModel.forward does not support {key!r}")
        if kwargs.get("output_attentions"):
            raise ValueError("DreamModel.forward does not support output_attentions=True")
        if output_hidden_states is None:
            output_hidden_states = bool(self.config.output_hidden_states)
        if return_dict is None:
            return_dict = self.config.return_dict if self.config.return_dict is not None else True
        hidden, all_hidden, presents = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states)
        logits = self.lm_head(hidden)
        cache = presents if use_cache else None
        if not return_dict:
            return tuple(v for v in (logits, cache, all_hidden) if v is not None)
        return DreamOutput(logits=logits, cache=cache, hidden_states=all_hidden)
