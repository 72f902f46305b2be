"""Native (no ``trust_remote_code``) implementation of SDAR dense for transformers 5.x.

Parameter names are exactly those of the published SDAR-1.7B/4B/8B-Chat checkpoints::

    model.embed_tokens.weight                              [V, d]
    model.layers.{i}.input_layernorm.weight                [d]
    model.layers.{i}.self_attn.q_proj.weight               [H * hd, d]
    model.layers.{i}.self_attn.k_proj.weight               [KV * hd, d]
    model.layers.{i}.self_attn.v_proj.weight               [KV * hd, d]
    model.layers.{i}.self_attn.o_proj.weight               [d, H * hd]
    model.layers.{i}.self_attn.q_norm.weight               [hd]   (RMSNorm over each head)
    model.layers.{i}.self_attn.k_norm.weight               [hd]
    model.layers.{i}.post_attention_layernorm.weight       [d]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight        SwiGLU
    model.norm.weight                                      [d]
    lm_head.weight                                         [V, d]  (untied)

Semantics (models.md §3): pre-norm Qwen3 block; ``head_dim`` is explicit (not ``d / H``); q and k
are projected, RMS-normalised per head over ``head_dim`` **before** NeoX rotate-half RoPE over the full
head; softmax scale ``head_dim ** -0.5``; GQA. Every RMSNorm normalises in fp32 and multiplies the
weight in fp32 before casting back (the published fused kernel; HF Qwen3 casts first). RoPE cos/sin
are computed in fp32 and cast to the activation dtype. Logits are **not** shifted.

Attention: there is no implicit mask. ``attention_mask`` is required — the caller supplies the
block-causal mask (inference) or the BD3LM mask (training, see :mod:`dare_core.models.block`); a
missing or malformed mask raises ``ValueError``. Accepted forms: boolean or 0/1 ``[B|1, 1, Q, K]``
or ``[B|1, Q, K]`` (True/1 = may attend), or a 2-D ``[B, K]`` key-padding mask (every query sees
every real key). ``K = P + Q`` when a cache of ``P`` positions is given.

KV cache (the DARE contract): ``past_key_values`` is ``None`` or a list with one ``(k, v)`` per layer,
``[B, KV, P, hd]`` keys after q/k-norm and RoPE; ``use_cache=True`` returns the list extended by
this call's ``Q`` positions (the published ``store_kv=True``; ``use_cache=False`` with a cache is
its ``store_kv=False``). ``position_ids`` default to ``P .. P+Q-1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as hf_init
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_sdar import SUPPORTED_ATTN_IMPLEMENTATIONS, SDARConfig

__all__ = [
    "SDARRMSNorm",
    "SDARMLP",
    "SDARAttention",
    "SDARDecoderLayer",
    "SDARPreTrainedModel",
    "SDARModel",
    "SDARForCausalLM",
    "prepare_attention_mask",
    "rope_cos_sin",
]

@dataclass
class SDAROutput:
    """Output of the decoder stack: final-norm hidden states and, with ``use_cache``, the cache.

    A plain dataclass: transformers 5's ``ModelOutput`` renames ``past_key_values`` (the DARE cache
    contract's name) to ``cache`` with a deprecation warning.
    """

    last_hidden_state: torch.Tensor
    past_key_values: Optional[list] = None
    hidden_states: Optional[tuple] = None


@dataclass
class SDARCausalLMOutput:
    """Output of the LM: unshifted ``logits`` and, with ``use_cache``, ``past_key_values``."""

    logits: torch.Tensor
    past_key_values: Optional[list] = None
    hidden_states: Optional[tuple] = None

    def to_tuple(self) -> tuple:
        return tuple(v for v in (self.logits, self.past_key_values, self.hidden_states) if v is not None)


# Keyword arguments of the published code that would change the result if honoured here.
_REJECTED_IF_SET = ("labels", "store_kv", "cache_position", "output_attentions", "output_router_logits")


class SDARRMSNorm(nn.Module):
    """RMSNorm as the published fused kernel computes it: normalise and scale in fp32, then cast."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (h * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class SDARMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """``(cos, sin)`` ``[B, 1, L, head_dim]``: fp32 angles ``pos * theta^(-2j/hd)`` (both halves),
    cast to ``dtype``."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device).float() / head_dim
    inv_freq = 1.0 / (float(theta) ** exponent)
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        ang = position_ids.float()[..., None] * inv_freq
        ang = torch.cat([ang, ang], dim=-1)[:, None]
        return ang.cos().to(dtype), ang.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def prepare_attention_mask(mask: Optional[torch.Tensor], batch: int, q_len: int, k_len: int) -> torch.Tensor:
    """Normalise the caller's mask to a boolean ``[B|1, 1, Q, K]`` (True = may attend).

    Raises ``ValueError`` for ``None`` and for any shape or value it cannot read unambiguously.
    """
    if mask is None:
        raise ValueError(
            "SDAR needs an explicit attention_mask: the block-causal mask at inference (query in "
            "block b sees keys in blocks <= b) or the BD3LM mask in training; it never falls back "
            "to bidirectional or causal attention (see dare_core.models.block)")
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a tensor, got {type(mask).__name__}")
    m = mask
    if m.dtype != torch.bool:
        if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
            raise ValueError(
                "attention_mask must be boolean or 0/1 (1 = may attend); additive float masks are "
                "not accepted (the published code reads the mask with .bool())")
        m = m != 0
    if m.dim() == 2:
        if tuple(m.shape) != (batch, k_len):
            raise ValueError(f"a 2-D attention_mask is a [batch, keys] padding mask of shape "
                             f"{(batch, k_len)}, got {tuple(m.shape)}")
        return m[:, None, None, :]
    if m.dim() == 3:
        m = m[:, None]
    if m.dim() != 4:
        raise ValueError(f"attention_mask must be 2-D, 3-D or 4-D, got {m.dim()}-D")
    b, h, q, k = m.shape
    if b not in (1, batch) or h != 1 or q != q_len or k != k_len:
        raise ValueError(f"attention_mask of shape {tuple(mask.shape)} does not match "
                         f"[batch={batch}, 1, queries={q_len}, keys={k_len}]")
    return m


class SDARAttention(nn.Module):
    def __init__(self, config: SDARConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.q_norm = SDARRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = SDARRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, past):
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, Q, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, Q, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if past is not None:
            k = torch.cat([past[0].to(k.dtype), k], dim=2)
            v = torch.cat([past[1].to(v.dtype), v], dim=2)
        present = (k, v)
        groups = self.num_heads // self.num_kv_heads
        kk = k.repeat_interleave(groups, dim=1) if groups > 1 else k
        vv = v.repeat_interleave(groups, dim=1) if groups > 1 else v
        impl = self.config._attn_implementation or "sdpa"
        if impl == "sdpa":
            out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=False, scale=self.scaling)
        elif impl == "eager":
            scores = torch.matmul(q, kk.transpose(-1, -2)) * self.scaling
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, vv)
        else:
            raise ValueError(f"SDAR supports attn_implementation in {SUPPORTED_ATTN_IMPLEMENTATIONS}, got {impl!r}")
        out = out.transpose(1, 2).reshape(B, Q, self.num_heads * self.head_dim)
        return self.o_proj(out), present


class SDARDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: ``h + attn(norm(h))`` then ``h + mlp(norm(h))``."""

    def __init__(self, config: SDARConfig, layer_idx: int, mlp: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.self_attn = SDARAttention(config, layer_idx)
        self.mlp = mlp if mlp is not None else SDARMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, cos, sin, mask, past=None):
        a, present = self.self_attn(self.input_layernorm(hidden_states), cos, sin, mask, past)
        h = hidden_states + a
        m = self.mlp(self.post_attention_layernorm(h))
        if isinstance(m, tuple):  # MoE block: (output, router logits)
            m = m[0]
        return h + m, present


class SDARPreTrainedModel(PreTrainedModel):
    config_class = SDARConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["SDARDecoderLayer"]
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
            if module.padding_idx is not None:
                hf_init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, SDARRMSNorm):
            hf_init.ones_(module.weight)


def _check_kwargs(cls_name: str, kwargs: dict[str, Any]) -> None:
    for key in _REJECTED_IF_SET:
        value = kwargs.get(key)
        if value is not None and value is not False:
            raise ValueError(f"{cls_name}.forward does not support {key!r} (block-diffusion training "
                             f"goes through the DARE model wrapper)")
    unknown = set(kwargs) - set(_REJECTED_IF_SET) - {"return_dict", "output_hidden_states", "inputs_embeds"}
    if unknown:
        raise ValueError(f"{cls_name}.forward got unexpected argument(s): {', '.join(sorted(unknown))}")


class SDARModel(SDARPreTrainedModel):
    """The decoder stack (``AutoModel`` of the published config): returns the final-norm hidden states."""

    def __init__(self, config: SDARConfig) -> None:
        config.check_supported()
        super().__init__(config)
        pad = config.pad_token_id
        pad = pad if isinstance(pad, int) and 0 <= pad < config.vocab_size else None
        self.padding_idx = pad
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, pad)
        self.layers = nn.ModuleList(self._make_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    @staticmethod
    def _make_layer(config, i: int) -> nn.Module:
        return SDARDecoderLayer(config, i)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Optional[list] = None,
                use_cache: Optional[bool] = False, inputs_embeds: Optional[torch.Tensor] = None,
                output_hidden_states: Optional[bool] = None, **kwargs: Any) -> SDAROutput:
        _check_kwargs(type(self).__name__, kwargs)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, Q, _ = h.shape
        if past_key_values is not None and not isinstance(past_key_values, (list, tuple)):
            raise ValueError("past_key_values must be None or a list with one (key, value) pair per layer "
                             f"(the DARE cache contract), got {type(past_key_values).__name__}")
        if past_key_values is not None and len(past_key_values) == 0:
            past_key_values = None
        if past_key_values is not None and len(past_key_values) != len(self.layers):
            raise ValueError(f"past_key_values has {len(past_key_values)} layers, the model {len(self.layers)}")
        P = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(P, P + Q, device=h.device)[None].expand(B, Q)
        else:
            if position_ids.dim() == 1:
                position_ids = position_ids[None]
            if position_ids.dim() != 2 or position_ids.shape[-1] != Q or position_ids.shape[0] not in (1, B):
                raise ValueError(f"position_ids must be [L], [1, L] or [B, L]; got {tuple(position_ids.shape)}")
            position_ids = position_ids.to(h.device).expand(B, Q)
        mask = prepare_attention_mask(attention_mask, B, Q, P + Q).to(h.device)
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, h.dtype)
        hidden = [] if output_hidden_states else None
        present = [] if use_cache else None
        for i, layer in enumerate(self.layers):
            if hidden is not None:
                hidden.append(h)
            h, kv = layer(h, cos, sin, mask, None if past_key_values is None else past_key_values[i])
            if present is not None:
                present.append(kv)
        h = self.norm(h)
        if hidden is not None:
            hidden.append(h)
        return SDAROutput(last_hidden_state=h, past_key_values=present,
                          hidden_states=tuple(hidden) if hidden is not None else None)


class SDARForCausalLM(SDARPreTrainedModel):
    """SDAR block-diffusion LM (``AutoModelForCausalLM``); ``forward`` returns unshifted logits."""

    _model_cls = SDARModel

    def __init__(self, config: SDARConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = self._model_cls(config)
        self.vocab_size = config.vocab_size
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

    def get_decoder(self) -> nn.Module:
        return self.model

    def forward_hidden(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                       position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[B, L, d]`` final-norm hidden states (the LM head not applied)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids).last_hidden_state

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Optional[list] = None,
                use_cache: Optional[bool] = False, logits_to_keep: int | torch.Tensor = 0,
                return_dict: Optional[bool] = None, **kwargs: Any) -> SDARCausalLMOutput | tuple:
        """Inference forward (see the module docstring for the mask and cache contracts).

        ``logits_to_keep``: an int ``k > 0`` keeps the last ``k`` positions, a tensor indexes them,
        0 keeps all (as in HF).
        """
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        h = out.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) and logits_to_keep > 0 else (
            slice(None) if isinstance(logits_to_keep, int) else logits_to_keep)
        logits = self.lm_head(h[:, keep, :])
        result = SDARCausalLMOutput(logits=logits, past_key_values=out.past_key_values,
                                    hidden_states=out.hidden_states)
        return result.to_tuple() if return_dict is False else result
