"""A tiny, family-free block-diffusion model for tests.

``ToyBlockLM`` is a two-layer pre-norm transformer with rotary positions and no built-in mask:
like the published block-diffusion models it *requires* an explicit attention mask (block-causal
at inference, the BD3LM mask of :mod:`dare_nn.block` in training) and raises on a missing
one. It honours the KV-cache contract of native family modules:

* ``forward(input_ids, attention_mask, position_ids=None, past_key_values=None, use_cache=False)``;
* ``past_key_values`` is ``None`` or a list with one ``(k, v)`` per layer, ``[B, heads, P, hd]``,
  keys after RoPE; the attention mask is then a boolean ``[B, 1, Q, P + Q]`` (keys = cache first,
  then the new tokens) or a 2-D ``[B, P + Q]`` key-padding mask;
* ``use_cache=True`` returns ``.past_key_values`` of length ``P + Q``.

Register :mod:`dare_nn.testing.toy_block` as a plugin to get the ``block_toy`` family (kind
``block``, block size 4) whose default rollout is dare-plugin-samplers' ``block`` backend. The wrapper's
``logits`` builds the block-causal mask from positions and ``denoise_logits`` the
``[noisy | clean]`` layout with :func:`~dare_nn.block.bd3lm_layout`.
"""

from __future__ import annotations

import json
import math
import os
import types
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dare_core.api import DareError, ModelFamily, hookimpl
from dare_core.testing.toy import make_char_tokenizer
from dare_nn.block import BlockDiffusionWrapper

__all__ = ["ToyBlockLM", "ToyBlockWrapper", "make_toy_block_wrapper", "BLOCK_SIZE"]

#: Block size of the ``block_toy`` family.
BLOCK_SIZE = 4
#: an absorbing-state (MASK) block-diffusion model with a KV cache
CAPABILITIES = frozenset({"kv_cache", "mask_token", "absorbing_elbo"})


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[B, H, L, hd]`` at positions ``pos`` ``[B, L]`` (fp32)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = pos.to(torch.float32)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)[:, None]
    first, second = x.float().chunk(2, dim=-1)
    rot = torch.cat([-second, first], dim=-1)
    return (x.float() * ang.cos() + rot * ang.sin()).to(x.dtype)


class _Layer(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.hd = dim // heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, h, pos, mask, past):
        B, Q, D = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(D, dim=-1)
        q, k, v = (t.view(B, Q, self.heads, self.hd).transpose(1, 2) for t in (q, k, v))
        q, k = _rope(q, pos), _rope(k, pos)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.hd))
        h = h + self.out(a.transpose(1, 2).reshape(B, Q, D))
        h = h + self.mlp(self.norm2(h))
        return h, (k, v)


class ToyBlockLM(nn.Module):
    """Embeddings → ``layers`` rotary attention layers → norm → LM head. Not shifted.

    The attention mask is mandatory (see the module docstring).
    """

    def __init__(self, vocab_size: int, dim: int = 32, heads: int = 2, layers: int = 2):
        super().__init__()
        self.vocab_size, self.dim, self.heads, self.n_layers = vocab_size, dim, heads, layers
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(_Layer(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def get_output_embeddings(self) -> nn.Linear:
        return self.head

    @staticmethod
    def _mask(attention_mask: Optional[torch.Tensor], B: int, Q: int, K: int) -> torch.Tensor:
        if attention_mask is None:
            raise ValueError(
                "ToyBlockLM needs an explicit attention mask (block-causal at inference, BD3LM "
                "in training); it never falls back to bidirectional or causal attention"
            )
        m = attention_mask
        if m.dim() == 2:
            if tuple(m.shape) != (B, K):
                raise ValueError(f"2-D attention_mask must be [B, P+Q] = {(B, K)}, got {tuple(m.shape)}")
            return m.bool()[:, None, None, :]
        if m.dim() == 4:
            if m.dtype != torch.bool:
                raise ValueError(f"4-D attention_mask must be boolean (True = may attend), got {m.dtype}")
            if m.shape[0] not in (1, B) or m.shape[1] != 1 or m.shape[2] != Q or m.shape[3] != K:
                raise ValueError(f"4-D attention_mask must be [B, 1, Q, P+Q] = {(B, 1, Q, K)}, got {tuple(m.shape)}")
            return m
        raise ValueError(f"attention_mask must be 2-D or 4-D, got {m.dim()}-D")

    def _run(self, input_ids, attention_mask, position_ids, past_key_values):
        B, Q = input_ids.shape
        P = 0 if not past_key_values else past_key_values[0][0].shape[2]
        if past_key_values is not None and past_key_values and len(past_key_values) != len(self.layers):
            raise ValueError(f"past_key_values has {len(past_key_values)} layers, the model {len(self.layers)}")
        if position_ids is None:
            position_ids = torch.arange(P, P + Q, device=input_ids.device).expand(B, Q)
        mask = self._mask(attention_mask, B, Q, P + Q)
        h = self.embed(input_ids)
        present = []
        for i, layer in enumerate(self.layers):
            past = past_key_values[i] if past_key_values else None
            h, kv = layer(h, position_ids, mask, past)
            present.append(kv)
        return self.norm(h), present

    def forward_hidden(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        return self._run(input_ids, attention_mask, position_ids, None)[0]

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False, **kwargs
    ):
        h, present = self._run(input_ids, attention_mask, position_ids, past_key_values)
        return types.SimpleNamespace(logits=self.head(h), past_key_values=present if use_cache else None)


class ToyBlockWrapper(BlockDiffusionWrapper):
    """Block-diffusion wrapper: block-causal inference, BD3LM ``[noisy | clean]`` training (the
    shared :class:`~dare_nn.block.BlockDiffusionWrapper`)."""

    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        os.makedirs(path, exist_ok=True)
        torch.save(
            state_dict if state_dict is not None else self.module.state_dict(), os.path.join(path, "toy_block.pt")
        )
        m = self.module
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(
                {
                    "model_type": "block_toy",
                    "vocab_size": m.vocab_size,
                    "dim": m.dim,
                    "heads": m.heads,
                    "layers": m.n_layers,
                    "block_size": self.block_size,
                },
                fh,
            )


def make_toy_block_wrapper(
    seed: int = 0, dim: int = 32, layers: int = 2, block_size: int = BLOCK_SIZE
) -> ToyBlockWrapper:
    """A fresh randomly initialised ``block_toy`` wrapper (character tokenizer)."""
    tok = make_char_tokenizer()
    torch.manual_seed(seed)
    module = ToyBlockLM(len(tok), dim=dim, layers=layers)
    return ToyBlockWrapper(
        family="block_toy",
        module=module,
        tokenizer=tok,
        kind="block",
        mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        capabilities=CAPABILITIES,
        block_size=block_size,
    )


def load(
    path: Optional[str],
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    attn_implementation: Optional[str] = None,
) -> ToyBlockWrapper:
    cfg: dict[str, Any] = {}
    if path and os.path.isfile(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as fh:
            cfg = json.load(fh)
        if cfg.get("model_type") != "block_toy":
            raise DareError(f"{path!r} is not a block_toy checkpoint (model_type {cfg.get('model_type')!r})")
    wrapper = make_toy_block_wrapper(
        dim=cfg.get("dim", 32), layers=cfg.get("layers", 2), block_size=cfg.get("block_size", BLOCK_SIZE)
    )
    weights = os.path.join(path or "", "toy_block.pt")
    if path and os.path.isfile(weights):
        wrapper.module.load_state_dict(torch.load(weights))
    wrapper.module.to(device=device, dtype=dtype)
    return wrapper


@hookimpl
def dare_register_model_wrappers(register):
    register(
        ModelFamily(
            name="block_toy",
            kind="block",
            load=load,
            capabilities=CAPABILITIES,
            block_size=BLOCK_SIZE,
            default_checkpoint=None,
            default_rollout="block",
            rollouts=("block",),
            description="tiny family-free block-diffusion model for tests",
        )
    )
