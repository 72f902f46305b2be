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

Semantics (plugin README): pre-norm Qwen3 block; ``head_dim`` is explicit (not ``d / H``); q and k
are projected, RMS-normalised per head over ``head_dim`` **before** NeoX rotate-half RoPE over the full
head; softmax scale ``head_dim ** -0.5``; GQA. Every RMSNorm normalises in fp32 and multiplies the
weight in fp32 before casting back (the published fused kernel; HF Qwen3 casts first). RoPE cos/sin
are computed in fp32 and cast to the activation dtype. Logits are **not** shifted.

Attention: there is no implicit mask. ``attention_mask`` is required — the caller supplies the
block-causal mask (inference) or the BD3LM mask (training, see :mod:`dare_nn.block`); a
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
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from dare_nn import layers

from .configuration_sdar import SDARConfig

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


class SDARRMSNorm(layers.RMSNorm):
    """RMSNorm as the published fused kernel computes it: normalise and scale in fp32, then cast."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps, weight_in_fp32=True)


class SDARMLP(layers.SwiGLU):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""


# ``(cos, sin)`` ``[B, 1, L, head_dim]`` (fp32 angles cast to ``dtype``) and rotate-half over the
# full head: the shared primitives under their historical names here.
rope_cos_sin = layers.rotary_cos_sin
_apply_rope = layers.apply_rotary


def prepare_attention_mask(mask: Optional[torch.Tensor], batch: int, q_len: int, k_len: int) -> torch.Tensor:
    """Normalise the caller's mask to a boolean ``[B|1, 1, Q, K]`` (True = may attend).

    Raises ``ValueError`` for ``None`` and for any shape or value it cannot read unambiguously.
    """
    if mask is None:
        raise layers.AttentionMaskError(
            "SDAR needs an explicit attention_mask: the block-causal mask at inference (query in "
            "block b sees keys in blocks <= b) or the BD3LM mask in training; it never falls back "
            "to bidirectional or causal attention (see dare_nn.block)"
        )
    if not isinstance(mask, torch.Tensor):
        raise layers.AttentionMaskError(f"attention_mask must be a tensor, got {type(mask).__name__}")
    if mask.dim() == 2:
        return layers.key_padding_mask(mask, batch, k_len)[:, None, None, :]
    m = mask
    if m.dtype != torch.bool:
        if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
            raise layers.AttentionMaskError(
                "attention_mask must be boolean or 0/1 (1 = may attend); additive float masks are "
                "not accepted (the published code reads the mask with .bool())"
            )
        m = m != 0
    if m.dim() == 3:
        m = m[:, None]
    if m.dim() != 4:
        raise layers.AttentionMaskError(f"attention_mask must be 2-D, 3-D or 4-D, got {m.dim()}-D")
    return layers.check_4d_mask(m, batch, 1, q_len, k_len, exact_queries=True)


class SDARAttention(nn.Module):
    def __init__(self, config: SDARConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.q_norm = SDARRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = SDARRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, past):
        B, Q, _ = x.shape
        # q/k RMSNorm per head over head_dim, then RoPE over the full head
        q = self.q_norm(self.q_proj(x).view(B, Q, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, Q, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = layers.split_heads(self.v_proj(x), self.num_kv_heads, self.head_dim)
        q, k = layers.apply_rotary(q, cos, sin), layers.apply_rotary(k, cos, sin)
        out, present = layers.attend(
            q, k, v, mask, scale=self.scaling, past=past, implementation=self.config._attn_implementation
        )
        return self.o_proj(out), present


class SDARDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: ``h + attn(norm(h))`` then ``h + mlp(norm(h))``."""

    def __init__(self, config: SDARConfig, layer_idx: int, mlp: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.self_attn = SDARAttention(config, layer_idx)
        self.mlp = mlp if mlp is not None else SDARMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)

    def _mlp_output(self, h: torch.Tensor) -> torch.Tensor:
        m = self.mlp(h)
        return m[0] if isinstance(m, tuple) else m  # MoE block: (output, router logits)

    def forward(self, hidden_states, cos, sin, mask, past=None, *, use_cache: bool = True):
        """``(output, (k, v))`` of one layer; ``(output, None)`` without ``use_cache``."""
        return layers.pre_norm_residual(
            hidden_states,
            self.input_layernorm,
            self.self_attn,
            self.post_attention_layernorm,
            self._mlp_output,
            cos,
            sin,
            mask,
            past,
            keep_present=use_cache,
        )


class SDARPreTrainedModel(layers.NativeModelDefaults, PreTrainedModel):
    config_class = SDARConfig
    _no_split_modules = ["SDARDecoderLayer"]


def _check_kwargs(cls_name: str, kwargs: dict[str, Any]) -> None:
    layers.reject_options(
        cls_name, kwargs, _REJECTED_IF_SET, hint=" (block-diffusion training goes through the DARE model wrapper)"
    )
    unknown = set(kwargs) - set(_REJECTED_IF_SET) - {"return_dict", "output_hidden_states", "inputs_embeds"}
    if unknown:
        raise ValueError(f"{cls_name}.forward got unexpected argument(s): {', '.join(sorted(unknown))}")


class SDARModel(layers.EmbeddingAccessors, SDARPreTrainedModel):
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

    input_embeddings_path = "embed_tokens"
    output_embeddings_path = None  # the decoder stack has no head

    @staticmethod
    def _make_layer(config, i: int) -> nn.Module:
        return SDARDecoderLayer(config, i)

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Optional[list] = None,
        use_cache: Optional[bool] = False,
        inputs_embeds: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        **kwargs: Any,
    ) -> SDAROutput:
        _check_kwargs(type(self).__name__, kwargs)
        cfg = self.config
        h, past, P, position_ids = layers.decoder_inputs(
            self.embed_tokens,
            input_ids,
            inputs_embeds,
            position_ids,
            past_key_values,
            n_layers=len(self.layers),
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
        )
        B, Q, _ = h.shape
        mask = prepare_attention_mask(attention_mask, B, Q, P + Q).to(h.device)
        cos, sin = layers.rotary_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta, h.dtype)
        h, hidden, present = layers.run_layers(
            self.layers,
            h,
            cos,
            sin,
            mask,
            past=past,
            final_norm=self.norm,
            output_hidden_states=bool(output_hidden_states),
            use_cache=bool(use_cache),
        )
        return SDAROutput(last_hidden_state=h, past_key_values=present, hidden_states=hidden)


class SDARForCausalLM(layers.EmbeddingAccessors, SDARPreTrainedModel):
    """SDAR block-diffusion LM (``AutoModelForCausalLM``); ``forward`` returns unshifted logits."""

    _model_cls = SDARModel

    def __init__(self, config: SDARConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = self._model_cls(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    input_embeddings_path = "model.embed_tokens"
    output_embeddings_path = "lm_head"

    def get_decoder(self) -> nn.Module:
        return self.model

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``[B, L, d]`` final-norm hidden states (the LM head not applied)."""
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Optional[list] = None,
        use_cache: Optional[bool] = False,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ) -> SDARCausalLMOutput | tuple:
        """Inference forward (see the module docstring for the mask and cache contracts).

        ``logits_to_keep``: an int ``k > 0`` keeps the last ``k`` positions, a tensor indexes them,
        0 keeps all (as in HF).
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
        h = out.last_hidden_state
        keep = (
            slice(-logits_to_keep, None)
            if isinstance(logits_to_keep, int) and logits_to_keep > 0
            else (slice(None) if isinstance(logits_to_keep, int) else logits_to_keep)
        )
        logits = self.lm_head(h[:, keep, :])
        result = SDARCausalLMOutput(logits=logits, past_key_values=out.past_key_values, hidden_states=out.hidden_states)
        return result.to_tuple() if return_dict is False else result
