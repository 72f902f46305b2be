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

import math
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from dare_nn import layers

from .configuration_llada import LLaDAConfig

__all__ = [
    "LLaDARMSNorm",
    "LLaDALlamaBlock",
    "LLaDAModel",
    "LLaDAPreTrainedModel",
    "LLaDAModelLM",
    "rotary_cos_sin",
    "apply_rotary",
]

# Keyword arguments of the original remote code (or of HF training loops) that
# would change the result if they were honoured; refusing them is safer than
# silently producing something else.
_REJECTED_IF_SET = (
    "cache",
    "labels",
    "cu_seqlens",
    "max_seqlen",
    "attention_bias",
    "replace_position",
    "output_attentions",
)


# fp32 ``(cos, sin)`` ``[B, 1, L, head_dim]`` (cos/sin are not cast: see :func:`apply_rotary`)
rotary_cos_sin = layers.rotary_cos_sin


class LLaDARMSNorm(layers.RMSNorm):
    """RMSNorm: normalise in fp32, cast back to the input dtype, then scale."""


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, full_precision: bool = True) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, L, hd]``; in fp32 when ``full_precision`` (result cast back), else in
    ``x``'s dtype with cos/sin cast to it (the published ``rope_full_precision`` switch)."""
    if full_precision:
        return layers.apply_rotary(x, cos, sin, upcast=True)
    return layers.apply_rotary(x, cos.to(x.dtype), sin.to(x.dtype))


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

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Self-attention of the ``L`` new tokens over ``past`` (cached, after RoPE) then themselves.

        Returns the output and ``(k, v)`` of cache + new tokens (``[B, n_kv_heads, P + L,
        head_dim]``, keys after RoPE). Scores are formed in fp32 (the published eager path).
        """
        q = layers.split_heads(self.q_proj(x), self.n_heads, self.head_dim)
        k = layers.split_heads(self.k_proj(x), self.n_kv_heads, self.head_dim)
        v = layers.split_heads(self.v_proj(x), self.n_kv_heads, self.head_dim)
        full = bool(self.config.rope_full_precision)
        q = apply_rotary(q, cos, sin, full)
        k = apply_rotary(k, cos, sin, full)
        out, kv = layers.attend(
            q,
            k,
            v,
            mask,
            scale=1.0 / math.sqrt(self.head_dim),
            past=past,
            implementation=self.config._attn_implementation,
            fp32_scores=True,
        )
        return self.attn_out(out), kv

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU with the published names: ``ff_out(silu(ff_proj(x)) * up_proj(x))``."""
        return layers.swiglu(x, self.ff_proj, self.up_proj, self.ff_out)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        *,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """``(output, (k, v))`` of one block (``(k, v)`` as in :meth:`attention`; ``None``
        without ``use_cache``)."""
        return layers.pre_norm_residual(
            hidden_states,
            self.attn_norm,
            self.attention,
            self.ff_norm,
            self.feed_forward,
            cos,
            sin,
            attention_mask,
            past,
            keep_present=use_cache,
        )


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------
class LLaDAModel(nn.Module):
    """Holds ``transformer`` = ModuleDict(wte, blocks, ln_f, ff_out) so names match the checkpoints."""

    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__()
        self.config = config
        rows = config.effective_embedding_size
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(rows, config.d_model),
                "blocks": nn.ModuleList(LLaDALlamaBlock(config, i) for i in range(config.n_layers)),
                "ln_f": LLaDARMSNorm(config.d_model, config.rms_norm_eps),
                "ff_out": nn.Linear(config.d_model, rows, bias=False),
            }
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        past_key_values: Any = None,
        use_cache: bool = False,
        apply_head: bool = True,
    ) -> (
        tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]
        | tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, list[tuple[torch.Tensor, torch.Tensor]]]
    ):
        """``(logits, hidden)``; with ``use_cache`` also the per-layer ``(k, v)`` list (see module doc).

        Default positions are ``0 .. L-1`` even with a cache (give ``position_ids`` then).
        """
        cfg = self.config
        x, past, cached, position_ids = layers.decoder_inputs(
            self.transformer["wte"],
            input_ids,
            inputs_embeds,
            position_ids,
            past_key_values,
            n_layers=cfg.n_layers,
            kv_heads=cfg.effective_n_kv_heads,
            head_dim=cfg.head_dim,
            positions_after_cache=False,
        )
        bsz, length, _ = x.shape
        cos, sin = layers.rotary_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta)
        mask = layers.prepare_attention_mask(attention_mask, bsz, length, cached + length, cfg.n_heads)
        if mask is not None:
            mask = mask.to(x.device)
        x, hidden, present = layers.run_layers(
            self.transformer["blocks"],
            x,
            cos,
            sin,
            mask,
            past=past,
            final_norm=self.transformer["ln_f"],
            output_hidden_states=output_hidden_states,
            use_cache=use_cache,
        )
        if not apply_head:  # forward_hidden: final-norm states, no [B, L, V] logits
            return x, None
        logits = self.transformer["ff_out"](x)
        if cfg.scale_logits:
            logits = logits * (1.0 / math.sqrt(cfg.d_model))
        if present is not None:
            return logits, hidden, present
        return logits, hidden


class LLaDAPreTrainedModel(layers.NativeModelDefaults, PreTrainedModel):
    config_class = LLaDAConfig
    _no_split_modules = ["LLaDALlamaBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        layers.init_weights(
            module,
            float(getattr(self.config, "init_std", 0.02) or 0.02),
            cutoff=getattr(self.config, "init_cutoff_factor", None),
        )


class LLaDAModelLM(layers.EmbeddingAccessors, LLaDAPreTrainedModel):
    """LLaDA masked-diffusion LM; ``forward`` returns unshifted logits ``[B, L, V]``."""

    def __init__(self, config: LLaDAConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = LLaDAModel(config)
        self.post_init()

    # PEFT / resize hooks: get/set_{input,output}_embeddings
    input_embeddings_path = "model.transformer.wte"
    output_embeddings_path = "model.transformer.ff_out"

    @property
    def logit_scale(self) -> float:
        """Multiplier of the head's output (``1/sqrt(d_model)`` when ``scale_logits``)."""
        return 1.0 / math.sqrt(self.config.d_model) if self.config.scale_logits else 1.0

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, L, d]`` states after ``ln_f``, the LM head not applied (for a fused cross
        entropy: ``logits = logit_scale * (hidden @ get_output_embeddings().weight.T)``)."""
        hidden, _ = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, apply_head=False
        )
        return hidden

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """HF resize; also keeps ``config.embedding_size`` (the row count LLaDA builds from) in sync."""
        embeds = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        rows = int(embeds.weight.shape[0])
        self.config.embedding_size = rows
        if self.config.vocab_size > rows:
            self.config.vocab_size = rows
        return embeds

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        return_dict: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
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
        layers.reject_options("LLaDAModelLM", kwargs, _REJECTED_IF_SET)
        if output_hidden_states is None:
            output_hidden_states = bool(self.config.output_hidden_states)
        if return_dict is None:
            return_dict = self.config.return_dict if self.config.return_dict is not None else True
        use_cache = bool(use_cache)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        logits, hidden = out[0], out[1]
        present = out[2] if use_cache else None
        if not return_dict:
            extra = tuple(t for t in (present, hidden) if t is not None)
            return (logits,) + extra
        if present is None:
            return CausalLMOutputWithPast(logits=logits, hidden_states=hidden)
        return layers.model_output(CausalLMOutputWithPast, present, logits=logits, hidden_states=hidden)
