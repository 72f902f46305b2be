"""Native (no ``trust_remote_code``) implementation of LLaDA2-MoE for transformers 5.x.

Parameter names are exactly those of the published LLaDA2.0-mini / 2.1-mini checkpoints::

    model.word_embeddings.weight                                   [V, d]
    model.layers.{i}.input_layernorm.weight                        [d]
    model.layers.{i}.attention.query_key_value.weight              [(H + 2 KV) * hd, d]  rows [Q | K | V], head-major
    model.layers.{i}.attention.query_layernorm.weight              [hd]
    model.layers.{i}.attention.key_layernorm.weight                [hd]
    model.layers.{i}.attention.dense.weight                        [d, H * hd]
    model.layers.{i}.post_attention_layernorm.weight               [d]
    dense layers (i < first_k_dense_replace):
        model.layers.{i}.mlp.{gate,up,down}_proj.weight
    MoE layers:
        model.layers.{i}.mlp.gate.weight                           [E, d]
        model.layers.{i}.mlp.gate.expert_bias                      [E]    (buffer, saved)
        model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
        model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
    model.norm.weight                                              [d]
    lm_head.weight                                                 [V, d]

Forward semantics (those of the published modeling file; see the plugin README):

* pre-norm decoder layers with HF-Llama RMSNorm (normalise in float32, cast back, times weight);
* fused QKV viewed as ``[B, L, H + 2 KV, hd]`` and split ``H / KV / KV`` heads; RMSNorm per head
  on q and k *before* RoPE; RoPE on the first ``rope_dim = int(hd * partial_rotary_factor)``
  dims only (rotate-half within them, ``inv_freq`` over ``rope_dim``), the rest pass through;
  ``cos``/``sin`` computed in float32 and cast to the hidden dtype; scale ``hd ** -0.5``;
* MoE router: ``s = sigmoid(x_fp32 · W_fp32ᵀ)``; selection score ``s + expert_bias``; experts in
  ``n_group`` groups, a group scored by the sum of its 2 best selection scores, the best
  ``topk_group`` groups kept, the top ``num_experts_per_tok`` experts by selection score among
  them; weights = the *unbiased* ``s`` of the chosen experts over their sum (+1e-20; only when
  more than one expert is chosen) times ``routed_scaling_factor``; output = Σ weight ·
  expert(x) (products summed in float32, cast back) + the always-on shared expert; the routed
  experts run grouped (:func:`dare_nn.moe.grouped_swiglu`: tokens sorted by expert, grouped GEMMs
  on a GPU) unless the block's ``experts_impl`` is ``"loop"`` (the per-expert reference loop;
  same outputs and gradients, ``tests/test_moe_grouped.py``; an expert that got no token gets a
  zero gradient instead of none);
* logits from ``lm_head``, returned as float32, **not shifted**.

Differences from the published code (deliberate):

* **Masks.** The published model silently attends bidirectionally when ``attention_mask`` is
  ``None`` under SDPA (causally under eager) and builds a *causal* + padding mask from a 2-D mask.
  Neither is ever what a block-diffusion caller wants, so here a missing mask, a 2-D mask
  without a KV cache, or a mask of the wrong shape/dtype raises :class:`LLaDA2MaskError`. Pass a
  4-D mask ``[B, 1, Q, K]`` — boolean (True = may attend) or additive float — e.g. from
  :func:`dare_nn.block.block_causal_mask`; it is used as is, like the published code
  does with 4-D masks.
* **KV cache.** ``past_key_values`` is DARE's list of per-layer ``(k, v)`` tensors
  ``[B, KV, P, hd]`` holding keys after q/k norm and RoPE (the position lives in RoPE, not in the
  slot); with a cache the mask is boolean/additive ``[B, 1, Q, P + Q]`` or a 2-D key-padding mask
  ``[B, P + Q]`` (every query sees every real key: exactly block-causal when the cache holds the
  earlier blocks and the queries are one block). ``use_cache=True`` returns the extended list as
  the output's ``cache`` (transformers 5 name; ``.past_key_values`` is its alias).
* ``output_attentions`` / ``output_router_logits`` and flex attention are not implemented.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as hf_init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast

from dare_core.api import DareError
from dare_nn import layers, moe

from .configuration_llada2_moe import LLaDA2MoeConfig

__all__ = [
    "LLaDA2MaskError",
    "LLaDA2MoeRMSNorm",
    "LLaDA2MoeMLP",
    "LLaDA2MoeGate",
    "LLaDA2MoeSparseMoeBlock",
    "LLaDA2MoeAttention",
    "LLaDA2MoeDecoderLayer",
    "LLaDA2MoePreTrainedModel",
    "LLaDA2MoeModel",
    "LLaDA2MoeModelLM",
    "rotary_cos_sin",
    "apply_partial_rotary",
]

KVCache = list  # list[tuple[torch.Tensor, torch.Tensor]], one (k, v) per layer


class LLaDA2MaskError(layers.AttentionMaskError):
    """A missing or malformed attention mask given to the LLaDA2 module."""


# ---------------------------------------------------------------------------------- norms / MLP
class LLaDA2MoeRMSNorm(layers.RMSNorm):
    """HF-Llama RMSNorm: normalise in float32, cast back to the input dtype, then times weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)


class LLaDA2MoeMLP(layers.SwiGLU):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""


# ---------------------------------------------------------------------------------- MoE
class LLaDA2MoeGate(nn.Module):
    """Group-limited sigmoid router with a selection-only ``expert_bias`` (see module docstring)."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.num_experts = config.num_experts
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.routed_scaling_factor = float(config.routed_scaling_factor)
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def select(self, selection: torch.Tensor) -> torch.Tensor:
        """Indices ``[N, top_k]`` of the experts chosen from selection scores ``[N, E]``."""
        n = selection.shape[0]
        grouped = selection.view(n, self.n_group, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.topk(group_score, k=self.topk_group, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_score).scatter_(1, keep, 1.0).bool()
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(n, -1)
        masked = selection.masked_fill(~expert_mask, float("-inf"))
        return torch.topk(masked, k=self.top_k, dim=-1).indices

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` ``[..., d]`` -> (indices ``[N, k]``, float32 weights ``[N, k]``, logits ``[N, E]``)."""
        flat = x.reshape(-1, x.shape[-1])
        logits = F.linear(flat.to(torch.float32), self.weight.to(torch.float32))
        scores = torch.sigmoid(logits)
        idx = self.select(scores + self.expert_bias)
        chosen = scores.gather(1, idx)
        if self.top_k > 1:
            chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, chosen * self.routed_scaling_factor, logits


class LLaDA2MoeSparseMoeBlock(moe.GroupedExperts):
    """Routed experts plus the always-on shared expert(s)."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        d, inner = config.hidden_size, config.moe_intermediate_size
        self.experts = nn.ModuleList(LLaDA2MoeMLP(d, inner) for _ in range(config.num_experts))
        self.gate = LLaDA2MoeGate(config)
        shared = config.num_shared_experts
        # The published code builds the shared MLP whenever num_shared_experts is not None; with 0
        # its width is 0 and it adds zeros, so skipping it computes the same thing.
        self.shared_experts = LLaDA2MoeMLP(d, inner * shared) if shared else None
        self.pack_experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, weight, _ = self.gate(flat)
        k = idx.shape[1]
        if self.grouped():
            per_slot = moe.grouped_swiglu(flat, idx, self.experts, self.experts_kernel).to(flat.dtype)
        else:
            per_slot = flat.new_zeros(flat.shape[0], k, shape[-1])
            for e in torch.unique(idx).tolist():
                rows, slots = (idx == e).nonzero(as_tuple=True)
                # under autocast the experts return the autocast dtype; the buffer keeps x's dtype
                per_slot[rows, slots] = self.experts[e](flat[rows]).to(per_slot.dtype)
        y = (per_slot.to(weight.dtype) * weight[..., None]).sum(dim=1).to(x.dtype).view(shape)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y


# ---------------------------------------------------------------------------------- RoPE
def rotary_cos_sin(
    position_ids: torch.Tensor, rope_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, L, rope_dim]``: computed in float32, cast to ``dtype``.

    ``inv_freq[j] = 1 / theta ** (2j / rope_dim)``; both halves use the same frequencies.
    """
    cos, sin = layers.rotary_cos_sin(position_ids, rope_dim, theta, dtype)
    return cos[:, 0], sin[:, 0]


def apply_partial_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` ``[B, H, L, hd]``; the rest pass through.

    ``cos``/``sin`` are ``[B, L, r]`` (from :func:`rotary_cos_sin`) or ``[B, 1, L, r]``.
    """
    r = cos.shape[-1]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    return torch.cat((layers.apply_rotary(x[..., :r], cos, sin), x[..., r:]), dim=-1)


# ---------------------------------------------------------------------------------- attention
class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rope_dim = config.rope_dim
        self.scaling = self.head_dim**-0.5
        self.query_key_value = nn.Linear(
            config.hidden_size, (self.num_heads + 2 * self.num_kv) * self.head_dim, bias=config.use_qkv_bias
        )
        self.query_layernorm = LLaDA2MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.key_layernorm = LLaDA2MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        bsz, length, _ = x.shape
        # fused projection, rows [Q | K | V] head-major; q/k RMSNorm per head before partial RoPE
        qkv = self.query_key_value(x).view(bsz, length, self.num_heads + 2 * self.num_kv, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv, self.num_kv], dim=-2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = apply_partial_rotary(self.query_layernorm(q), cos, sin)
        k = apply_partial_rotary(self.key_layernorm(k), cos, sin)
        out, present = layers.attend(
            q, k, v, mask, scale=self.scaling, past=past, implementation=self.config._attn_implementation
        )
        return self.dense(out), present


class LLaDA2MoeDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = LLaDA2MoeAttention(config, layer_idx)
        if config.is_moe_layer(layer_idx):
            self.mlp: nn.Module = LLaDA2MoeSparseMoeBlock(config)
        else:
            self.mlp = LLaDA2MoeMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        *,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, Optional[tuple[torch.Tensor, torch.Tensor]]]:
        """``(output, (k, v))`` of one layer; ``(output, None)`` without ``use_cache``."""
        return layers.pre_norm_residual(
            hidden,
            self.input_layernorm,
            self.attention,
            self.post_attention_layernorm,
            self.mlp,
            cos,
            sin,
            mask,
            past,
            keep_present=use_cache,
        )


# ---------------------------------------------------------------------------------- masks
def check_mask(attention_mask: Any, batch: int, q_len: int, past_len: int, n_heads: int) -> torch.Tensor:
    """Validate ``attention_mask`` and return it in 4-D form (see the module docstring)."""
    k_len = past_len + q_len
    if attention_mask is None:
        raise LLaDA2MaskError(
            "LLaDA2 needs an explicit attention mask (the published code would silently attend "
            "bidirectionally or causally); pass a 4-D [B, 1, Q, K] mask, e.g. "
            "dare_nn.block.block_causal_mask, or use the DARE model wrapper"
        )
    if not isinstance(attention_mask, torch.Tensor):
        raise LLaDA2MaskError(f"attention_mask must be a tensor, got {type(attention_mask).__name__}")
    m = attention_mask
    if m.dim() == 2:
        if past_len == 0:
            raise LLaDA2MaskError(
                "a 2-D attention_mask without a KV cache is ambiguous (the published code turns it "
                "into a causal mask); pass a 4-D [B, 1, Q, K] block-causal mask"
            )
        keep = layers.key_padding_mask(m, batch, k_len, error=LLaDA2MaskError)
        return keep[:, None, None, :].expand(batch, 1, q_len, k_len)
    if m.dim() != 4:
        raise LLaDA2MaskError(f"attention_mask must be 4-D [B, 1, Q, K] (or 2-D with a cache), got {m.dim()}-D")
    return layers.check_4d_mask(m, batch, n_heads, q_len, k_len, exact_queries=True, error=LLaDA2MaskError)


# ---------------------------------------------------------------------------------- models
class LLaDA2MoePreTrainedModel(layers.NativeModelDefaults, PreTrainedModel):
    config_class = LLaDA2MoeConfig
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LLaDA2MoeGate):
            hf_init.normal_(module.weight, mean=0.0, std=float(self.config.initializer_range))
            hf_init.zeros_(module.expert_bias)


class LLaDA2MoeModel(layers.EmbeddingAccessors, LLaDA2MoePreTrainedModel):
    """The backbone (``AutoModel``): embeddings, decoder layers, final norm -> hidden states."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        config.check_supported()
        super().__init__(config)
        pad = config.pad_token_id
        pad = pad if pad is not None and 0 <= pad < config.vocab_size else None
        # padding_idx as in the published code: that row starts at zero and gets no gradient.
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, pad)
        self.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    input_embeddings_path = "word_embeddings"
    output_embeddings_path = None  # the backbone has no head

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Optional[KVCache] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        use_cache: Optional[bool] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ) -> MoeModelOutputWithPast | tuple:
        """Hidden states after the final norm, ``[B, Q, d]``; see the module docstring for masks."""
        rejected = ("output_attentions", "output_router_logits")
        layers.reject_options("LLaDA2MoeModel", kwargs, rejected)
        unknown = {k for k, v in kwargs.items() if v is not None and k not in rejected}
        if unknown:
            raise DareError(f"LLaDA2MoeModel.forward got unsupported argument(s): {', '.join(sorted(unknown))}")
        cfg = self.config
        x, past, past_len, position_ids = layers.decoder_inputs(
            self.word_embeddings,
            input_ids,
            inputs_embeds,
            position_ids,
            past_key_values,
            n_layers=len(self.layers),
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
        )
        bsz, q_len, _ = x.shape
        mask = check_mask(attention_mask, bsz, q_len, past_len, cfg.num_attention_heads).to(x.device)
        cos, sin = layers.rotary_cos_sin(position_ids, cfg.rope_dim, cfg.rope_theta, x.dtype)
        use_cache = bool(use_cache if use_cache is not None else False)
        want_hidden = bool(output_hidden_states if output_hidden_states is not None else cfg.output_hidden_states)
        x, hidden, presents = layers.run_layers(
            self.layers,
            x,
            cos,
            sin,
            mask,
            past=past,
            final_norm=self.norm,
            output_hidden_states=want_hidden,
            use_cache=use_cache,
        )
        out = layers.model_output(MoeModelOutputWithPast, presents, last_hidden_state=x, hidden_states=hidden)
        if return_dict is False:
            return out.to_tuple()
        return out


class LLaDA2MoeModelLM(layers.EmbeddingAccessors, LLaDA2MoePreTrainedModel):
    """LLaDA2-MoE with its LM head (``AutoModelForCausalLM``); logits float32, not shifted."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        config.check_supported()
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    input_embeddings_path = "model.word_embeddings"
    output_embeddings_path = "lm_head"

    def get_decoder(self) -> LLaDA2MoeModel:
        return self.model

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``[B, L, d]`` hidden states after the final norm (the head is not applied)."""
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Optional[KVCache] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        use_cache: Optional[bool] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ) -> MoeCausalLMOutputWithPast | tuple:
        """Logits ``[B, Q, V]`` (float32, position ``i`` scores token ``i``).

        ``labels`` gives the published same-position cross entropy (no shift; -100 ignored).
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        logits = self.lm_head(out.last_hidden_state).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device))
        result = layers.model_output(
            MoeCausalLMOutputWithPast,
            layers.output_cache(out),
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
        )
        if return_dict is False:
            return result.to_tuple()
        return result
