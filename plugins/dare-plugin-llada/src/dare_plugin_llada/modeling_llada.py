"""Native (no ``trust_remote_code``) implementation of LLaDA for transformers 5.x.

Parameter names are exactly those of the published LLaDA checkpoints::

    model.transformer.wte.weight                     [V, d]
    model.transformer.blocks.{i}.attn_norm.weight    [d]
    model.transformer.blocks.{i}.q_proj.weight       [d, d]
    model.transformer.blocks.{i}.k_proj.weight       [kv*hd, d]
    model.transformer.blocks.{i}.v_proj.weight       [kv*hd, d]
    model.transformer.blocks.{i}.attn_out.weight     [d, d]
    model.transformer.blocks.{i}.ff_norm.weight      [d]
    model.transformer.blocks.{i}.ff_proj.weight      [m, d]   gate (silu branch)
    model.transformer.blocks.{i}.up_proj.weight      [m, d]   linear branch
    model.transformer.blocks.{i}.ff_out.weight       [d, m]   down projection
    model.transformer.ln_f.weight                    [d]
    model.transformer.ff_out.weight                  [V, d]   LM head (untied)

Semantics: pre-norm llama block, RMSNorm in fp32 (cast back, then times the
weight), NeoX rotate-half RoPE computed and applied in fp32, GQA by repeating
k/v heads, softmax scale ``1/sqrt(head_dim)``, fully bidirectional attention
(there is no causal mask anywhere), no dropout.  Logits are NOT shifted:
``logits[:, i]`` scores the token at position ``i``.

KV cache (DARE's cache contract, used by cached rollouts): ``past_key_values`` is ``None`` or a
list with one ``(k, v)`` per layer, each ``[B, n_kv_heads, P, head_dim]`` holding keys *after*
RoPE for ``P`` cached positions in any order (a position lives in its RoPE phase, not its slot).
The ``Q`` new tokens attend to the cache first, then to themselves; with a cache the attention
mask is a bool ``[B, 1, Q, P+Q]`` (True = may attend) or a 2-D ``[B, P+Q]`` key-padding mask.
``use_cache=True`` returns ``past_key_values`` = one ``(k, v)`` of length ``P+Q`` per layer
(cache, then the new tokens). Without a cache the forward is unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as hf_init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import SUPPORTED_ATTN_IMPLEMENTATIONS, LLaDAConfig

# transformers 5 renamed the output field ``past_key_values`` to ``cache`` (the old name still
# works but warns); returned under whichever name this transformers version declares.
_CACHE_FIELD = ("cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
                else "past_key_values")

__all__ = [
    "LLaDARMSNorm",
    "LLaDALlamaBlock",
    "LLaDAModel",
    "LLaDAPreTrainedModel",
    "LLaDAModelLM",
    "prepare_attention_mask",
    "rotary_cos_sin",
    "apply_rotary",
]

# Keyword arguments of the original remote code (or of HF training loops) that
# would change the result if they were honoured; refusing them is safer than
# silently producing something else.
_REJECTED_IF_SET = ("cache", "labels", "cu_seqlens", "max_seqlen",
                    "attention_bias", "replace_position")


class LLaDARMSNorm(nn.Module):
    """RMSNorm: normalise in fp32, cast back to the input dtype, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


# ---------------------------------------------------------------------------
# Rotary embeddings
# ---------------------------------------------------------------------------
def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)`` of shape ``[B, 1, L, head_dim]`` for ``position_ids`` ``[B, L]``.

    ``inv_freq[j] = 1 / theta ** (2j / head_dim)``; both halves of the head use
    the same frequencies (NeoX rotate-half layout).
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=position_ids.device) / head_dim
    inv_freq = 1.0 / (float(theta) ** exponent)
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        angles = position_ids.to(torch.float32)[..., None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, full_precision: bool = True) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, L, hd]``; in fp32 when ``full_precision`` (result cast back)."""
    if full_precision:
        with torch.autocast(device_type=x.device.type, enabled=False):
            xf = x.float()
            return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


# ---------------------------------------------------------------------------
# Attention masks
# ---------------------------------------------------------------------------
def prepare_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int,
                           n_heads: int, key_length: int | None = None) -> torch.Tensor | None:
    """Normalise ``attention_mask`` to ``None`` or a 4D tensor for the attention kernels.

    ``length`` is the number of queries ``Q``; ``key_length`` the number of keys ``K``
    (``P + Q`` with a KV cache of ``P`` positions; ``Q`` by default).

    * ``None`` -> ``None``;
    * 2D ``[B, K]`` 0/1 key-padding mask (bool/int/float) -> ``None`` when it is
      all ones, else a bool ``[B, 1, 1, K]`` (True = key may be attended);
    * 4D bool (True = may attend) or 4D floating additive mask, broadcastable to
      ``[B, n_heads, Q, K]`` -> returned unchanged;
    * anything else -> ``ValueError``.
    """
    keys = length if key_length is None else int(key_length)
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a tensor or None, got {type(attention_mask).__name__}")
    m = attention_mask
    if m.dim() == 2:
        if tuple(m.shape) != (batch, keys):
            raise ValueError(f"2D attention_mask must have shape {(batch, keys)}, got {tuple(m.shape)}")
        if m.dtype == torch.bool:
            keep = m
        else:
            if m.is_complex():
                raise ValueError("attention_mask must not be complex")
            if not bool(((m == 0) | (m == 1)).all()):
                raise ValueError("2D attention_mask must be a 0/1 key-padding mask; pass additive masks as 4D")
            keep = m != 0
        if bool(keep.all()):
            return None
        return keep[:, None, None, :]
    if m.dim() == 4:
        if not (m.dtype == torch.bool or m.is_floating_point()):
            raise ValueError(f"4D attention_mask must be bool or floating (additive), got {m.dtype}")
        b, h, q, k = m.shape
        if b not in (1, batch) or h not in (1, n_heads) or q not in (1, length) or k != keys:
            raise ValueError(
                f"4D attention_mask of shape {tuple(m.shape)} does not broadcast to "
                f"{(batch, n_heads, length, keys)}")
        return m
    raise ValueError(f"attention_mask must be None, 2D [B, K] or 4D [B, 1, Q, K]; got {m.dim()}D")


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, kv, L, hd] -> [B, kv*groups, L, hd]; query head h uses kv head h // groups."""
    if groups == 1:
        return x
    return x.repeat_interleave(groups, dim=1)


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    dead_rows = None
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
            dead_rows = ~mask.any(dim=-1, keepdim=True)
        else:
            mask_f = mask.float()
            scores = scores + mask_f
            dead_rows = torch.isneginf(mask_f).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1)
    if dead_rows is not None:
        # Queries that may attend to nothing output zeros (same as torch SDPA).
        probs = probs.masked_fill(dead_rows, 0.0)
    return torch.matmul(probs.to(v.dtype), v)


def _sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    scale: float) -> torch.Tensor:
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)


# ---------------------------------------------------------------------------
# Transformer block
# ---------------------------------------------------------------------------
class LLaDALlamaBlock(GradientCheckpointingLayer):
    """Pre-norm llama block with bidirectional self-attention and a SwiGLU MLP."""

    def __init__(self, config: LLaDAConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        d = config.d_model
        self.n_heads = config.n_heads
        self.n_kv_heads = config.effective_n_kv_heads
        self.head_dim = d // config.n_heads
        hidden = config.effective_mlp_hidden_size
        qkv_bias = bool(config.include_qkv_bias)
        self.attn_norm = LLaDARMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = LLaDARMSNorm(d, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.ff_out = nn.Linear(hidden, d, bias=False)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mask: torch.Tensor | None,
                  past: tuple[torch.Tensor, torch.Tensor] | None = None,
                  want_kv: bool = False) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Self-attention of the ``L`` new tokens over ``past`` (cached, after RoPE) then themselves.

        Returns the output, and with ``want_kv`` also ``(k, v)`` of cache + new tokens
        (``[B, n_kv_heads, P + L, head_dim]``, keys after RoPE).
        """
        bsz, length, _ = x.shape
        q = self.q_proj(x).view(bsz, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        full = bool(self.config.rope_full_precision)
        q = apply_rotary(q, cos, sin, full)
        k = apply_rotary(k, cos, sin, full)
        if past is not None:
            k = torch.cat([past[0].to(k.dtype), k], dim=2)
            v = torch.cat([past[1].to(v.dtype), v], dim=2)
        kv = (k, v)
        groups = self.n_heads // self.n_kv_heads
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        impl = self.config._attn_implementation or "sdpa"
        scale = 1.0 / math.sqrt(self.head_dim)
        if impl == "sdpa":
            out = _sdpa_attention(q, k, v, mask, scale)
        elif impl == "eager":
            out = _eager_attention(q, k, v, mask, scale)
        else:
            raise ValueError(f"LLaDA supports attn_implementation in {SUPPORTED_ATTN_IMPLEMENTATIONS}, got {impl!r}")
        out = out.transpose(1, 2).reshape(bsz, length, self.n_heads * self.head_dim)
        out = self.attn_out(out)
        return (out, kv) if want_kv else out

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None,
                want_kv: bool = False) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        a = self.attention(self.attn_norm(hidden_states), cos, sin, attention_mask, past, want_kv)
        a, kv = a if want_kv else (a, None)
        h = hidden_states + a
        g = self.ff_norm(h)
        out = h + self.ff_out(F.silu(self.ff_proj(g)) * self.up_proj(g))
        return (out, kv) if want_kv else out


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------
class LLaDAModel(nn.Module):
    """Holds ``transformer`` = ModuleDict(wte, blocks, ln_f, ff_out) so names match the checkpoints."""

    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__()
        self.config = config
        rows = config.effective_embedding_size
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(rows, config.d_model),
            "blocks": nn.ModuleList(LLaDALlamaBlock(config, i) for i in range(config.n_layers)),
            "ln_f": LLaDARMSNorm(config.d_model, config.rms_norm_eps),
            "ff_out": nn.Linear(config.d_model, rows, bias=False),
        })

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                output_hidden_states: bool = False, past_key_values: Any = None,
                use_cache: bool = False, apply_head: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None] | tuple[
                    torch.Tensor, tuple[torch.Tensor, ...] | None, list[tuple[torch.Tensor, torch.Tensor]]]:
        """``(logits, hidden)``; with ``use_cache`` also the per-layer ``(k, v)`` list (see module doc)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.transformer["wte"](input_ids) if inputs_embeds is None else inputs_embeds
        if x.dim() != 3:
            raise ValueError(f"expected [B, L] input_ids or [B, L, d] inputs_embeds, got {tuple(x.shape)}")
        bsz, length, _ = x.shape
        if position_ids is None:
            position_ids = torch.arange(length, device=x.device)[None].expand(bsz, length)
        else:
            if position_ids.dim() == 1:
                position_ids = position_ids[None]
            if position_ids.dim() != 2 or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, bsz):
                raise ValueError(f"position_ids must have shape [L], [1, L] or [B, L]; got {tuple(position_ids.shape)}")
            position_ids = position_ids.to(x.device).expand(bsz, length)
        cos, sin = rotary_cos_sin(position_ids, self.config.d_model // self.config.n_heads, self.config.rope_theta)
        past = self._check_past(past_key_values, bsz)
        cached = 0 if past is None else int(past[0][0].shape[2])
        mask = prepare_attention_mask(attention_mask, bsz, length, self.config.n_heads, cached + length)
        if mask is not None:
            mask = mask.to(x.device)

        hidden: list[torch.Tensor] | None = [] if output_hidden_states else None
        present: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if use_cache else None
        for i, block in enumerate(self.transformer["blocks"]):
            if hidden is not None:
                hidden.append(x)
            layer_past = None if past is None else past[i]
            if present is not None:
                x, kv = block(x, cos, sin, mask, layer_past, True)
                present.append(kv)
            elif layer_past is not None:
                x = block(x, cos, sin, mask, layer_past)
            else:
                x = block(x, cos, sin, mask)
        x = self.transformer["ln_f"](x)
        if hidden is not None:
            hidden.append(x)  # last entry: after ln_f
        if not apply_head:  # forward_hidden: final-norm states, no [B, L, V] logits
            return x, None
        logits = self.transformer["ff_out"](x)
        if self.config.scale_logits:
            logits = logits * (1.0 / math.sqrt(self.config.d_model))
        hidden_out = tuple(hidden) if hidden is not None else None
        if present is not None:
            return logits, hidden_out, present
        return logits, hidden_out

    def _check_past(self, past_key_values: Any, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Validate a KV cache: one ``(k, v)`` per layer, ``[B, n_kv_heads, P, head_dim]`` each."""
        if past_key_values is None:
            return None
        n_layers = len(self.transformer["blocks"])
        if not isinstance(past_key_values, (list, tuple)) or len(past_key_values) != n_layers:
            raise ValueError(f"past_key_values must be a list of {n_layers} (k, v) pairs (one per layer)")
        kv_heads = self.config.effective_n_kv_heads
        head_dim = self.config.d_model // self.config.n_heads
        out = []
        length = None
        for pair in past_key_values:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(
                    isinstance(t, torch.Tensor) for t in pair):
                raise ValueError("every past_key_values entry must be a (k, v) pair of tensors")
            k, v = pair
            if k.dim() != 4 or k.shape != v.shape or k.shape[0] != batch or k.shape[1] != kv_heads \
                    or k.shape[3] != head_dim or (length is not None and k.shape[2] != length):
                raise ValueError(
                    f"past_key_values tensors must all be [B={batch}, n_kv_heads={kv_heads}, P, "
                    f"head_dim={head_dim}]; got {tuple(k.shape)} and {tuple(v.shape)}")
            length = k.shape[2]
            out.append((k, v))
        return out


class LLaDAPreTrainedModel(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDALlamaBlock"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False

    def _init_weights(self, module: nn.Module) -> None:
        std = float(getattr(self.config, "init_std", 0.02) or 0.02)
        cutoff = getattr(self.config, "init_cutoff_factor", None)

        def draw(t: torch.Tensor) -> None:
            if cutoff:
                hf_init.trunc_normal_(t, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
            else:
                hf_init.normal_(t, mean=0.0, std=std)

        if isinstance(module, nn.Linear):
            draw(module.weight)
            if module.bias is not None:
                hf_init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            draw(module.weight)
        elif isinstance(module, LLaDARMSNorm):
            hf_init.ones_(module.weight)


class LLaDAModelLM(LLaDAPreTrainedModel):
    """LLaDA masked-diffusion LM; ``forward`` returns unshifted logits ``[B, L, V]``."""

    def __init__(self, config: LLaDAConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = LLaDAModel(config)
        self.post_init()

    # PEFT / resize hooks -------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.transformer["wte"]

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.transformer["wte"] = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.transformer["ff_out"]

    @property
    def logit_scale(self) -> float:
        """Multiplier of the head's output (``1/sqrt(d_model)`` when ``scale_logits``)."""
        return 1.0 / math.sqrt(self.config.d_model) if self.config.scale_logits else 1.0

    def forward_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, L, d]`` states after ``ln_f``, the LM head not applied (for a fused cross
        entropy: ``logits = logit_scale * (hidden @ get_output_embeddings().weight.T)``)."""
        hidden, _ = self.model(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, apply_head=False)
        return hidden

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.model.transformer["ff_out"] = value

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """HF resize; also keeps ``config.embedding_size`` (the row count LLaDA builds from) in sync."""
        embeds = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        rows = int(embeds.weight.shape[0])
        self.config.embedding_size = rows
        if self.config.vocab_size > rows:
            self.config.vocab_size = rows
        return embeds

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                past_key_values: Any = None, use_cache: bool | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast | tuple:
        """Bidirectional forward.

        Args:
            input_ids: ``[B, L]`` token ids (or give ``inputs_embeds`` ``[B, L, d]``).
            attention_mask: ``None``; 2D ``[B, L]`` 0/1 key-padding mask; 4D bool
                ``[B, 1, L, L]`` (True = may attend) or 4D additive float mask.
            position_ids: optional ``[B, L]`` / ``[L]`` RoPE positions (default
                ``0..L-1``), e.g. restarting per sequence in packed batches (give a
                block-diagonal 4D mask as well).
            past_key_values: ``None`` or one ``(k, v)`` per layer, ``[B, n_kv_heads, P, hd]``
                keys after RoPE, for ``P`` cached positions the new tokens also attend to;
                ``attention_mask`` then covers ``P + L`` keys (cache first).
            use_cache: return ``past_key_values`` = per-layer ``(k, v)`` of cache + new
                tokens (``P + L`` positions). Off by default.
        """
        for key in _REJECTED_IF_SET:
            if kwargs.get(key) is not None:
                raise ValueError(f"LLaDAModelLM.forward does not support {key!r}")
        if kwargs.get("output_attentions"):
            raise ValueError("LLaDAModelLM.forward does not support output_attentions=True")
        if output_hidden_states is None:
            output_hidden_states = bool(self.config.output_hidden_states)
        if return_dict is None:
            return_dict = self.config.return_dict if self.config.return_dict is not None else True
        use_cache = bool(use_cache)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states,
                         past_key_values=past_key_values, use_cache=use_cache)
        logits, hidden = out[0], out[1]
        present = out[2] if use_cache else None
        if not return_dict:
            extra = tuple(t for t in (present, hidden) if t is not None)
            return (logits,) + extra
        if present is None:
            return CausalLMOutputWithPast(logits=logits, hidden_states=hidden)
        return CausalLMOutputWithPast(logits=logits, hidden_states=hidden, **{_CACHE_FIELD: present})
