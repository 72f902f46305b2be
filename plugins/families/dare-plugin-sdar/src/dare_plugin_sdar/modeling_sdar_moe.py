"""Native implementation of SDAR-MoE (``sdar_moe``, SDAR-30B-A3B-Chat) for transformers 5.x.

Same attention, norms, RoPE, mask and cache contracts as :mod:`.modeling_sdar`; the MLP of every
layer selected by :meth:`SDARMoeConfig.is_moe_layer` (all of them in the published checkpoint) is
a sparse mixture of experts::

    model.layers.{i}.mlp.gate.weight                          [E, d]   router, no bias
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight   SwiGLU of width moe_intermediate_size

Router (plugin README): ``softmax(gate(x))`` over all experts in fp32 → top-``num_experts_per_tok``
→ renormalised to sum 1 when ``norm_topk_prob`` → cast to the activation dtype → ``Σ w_e · expert_e(x)``.
There is no shared expert. The router auxiliary loss is not computed (``output_router_logits`` is
rejected).

Experts: computed grouped (:func:`dare_nn.moe.grouped_swiglu`: tokens sorted by expert, the experts
run over contiguous segments, as grouped GEMMs on a GPU) unless the block's ``experts_impl`` is
``"loop"``, the per-expert reference loop (``block.experts_impl = "loop"``, or on the class for
every block); both give the same outputs and gradients (``tests/test_moe_grouped.py``; an expert
that got no token gets a zero gradient instead of none). Parameter names are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dare_nn import moe

from .configuration_sdar import SDARMoeConfig
from .modeling_sdar import (
    SDARMLP,
    SDARDecoderLayer,
    SDARForCausalLM,
    SDARModel,
    SDARPreTrainedModel,
)

__all__ = ["SDARMoeSparseMoeBlock", "SDARMoeModel", "SDARMoeForCausalLM", "route"]


def route(router_logits: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype):
    """``(weights [N, k] in dtype, experts [N, k])`` from ``[N, E]`` router logits (see module doc)."""
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype), experts


class SDARMoeSparseMoeBlock(moe.GroupedExperts):
    def __init__(self, config: SDARMoeConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = bool(config.norm_topk_prob)
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            SDARMLP(config.hidden_size, config.moe_intermediate_size) for _ in range(config.num_experts)
        )
        self.pack_experts()

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, L, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        router_logits = self.gate(x)
        weights, experts = route(router_logits, self.top_k, self.norm_topk_prob, x.dtype)
        if self.grouped():
            y = moe.grouped_swiglu(x, experts, self.experts, self.experts_kernel)
            out = (y * weights[..., None]).sum(dim=1).to(x.dtype)
            return out.reshape(B, L, D), router_logits
        out = torch.zeros_like(x)
        for e in torch.unique(experts).tolist():
            rows, slot = torch.where(experts == e)
            y = self.experts[e](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(x.dtype))
        return out.reshape(B, L, D), router_logits


class SDARMoeModel(SDARModel):
    """SDAR-MoE decoder stack (``AutoModel`` of the published config)."""

    config_class = SDARMoeConfig

    @staticmethod
    def _make_layer(config: SDARMoeConfig, i: int) -> nn.Module:
        mlp = (
            SDARMoeSparseMoeBlock(config)
            if config.is_moe_layer(i)
            else SDARMLP(config.hidden_size, config.intermediate_size)
        )
        return SDARDecoderLayer(config, i, mlp=mlp)


class SDARMoePreTrainedModel(SDARPreTrainedModel):
    config_class = SDARMoeConfig


class SDARMoeForCausalLM(SDARForCausalLM):
    """SDAR-MoE block-diffusion LM (``AutoModelForCausalLM``); unshifted logits."""

    config_class = SDARMoeConfig
    _model_cls = SDARMoeModel
