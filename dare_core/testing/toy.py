"""A tiny, family-free masked-diffusion model for tests.

``ToyDiffusionLM`` is one bidirectional attention layer over token + position embeddings; the
tokenizer is character level (printable ASCII plus the special tokens), built in memory. Register
:mod:`dare_core.testing.toy` as a plugin to get a ``toy`` model family.
"""

from __future__ import annotations

import json
import os
import string
import types
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dare_core.interfaces import ModelFamily, RolloutBatch
from dare_core.models.base import HFDiffusionWrapper
from dare_core.plugins import hookimpl

SPECIALS = ["<pad>", "<eos>", "<mask>", "<bos>"]


def make_char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` with a trivial chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", mask_token="<mask>", bos_token="<bos>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "
    return fast


class ToyDiffusionLM(nn.Module):
    """Embeddings → one bidirectional attention block → LM head. Not shifted.

    Honours DARE's KV-cache contract: ``past_key_values`` is ``None`` or ``[(k, v)]`` (one
    layer) with ``[B, heads, P, head_dim]`` keys of ``P`` cached positions in any order (absolute
    position embeddings are added before the projections, so a key carries its position);
    ``attention_mask`` is then a 2-D ``[B, P + Q]`` key-padding mask or a bool
    ``[B, 1, Q, P + Q]`` mask (True = may attend), keys = cache first, then the new tokens;
    ``use_cache=True`` returns ``past_key_values`` of ``P + Q`` positions.
    """

    def __init__(self, vocab_size: int, dim: int = 32, max_len: int = 512, heads: int = 2):
        super().__init__()
        self.vocab_size, self.dim, self.max_len, self.heads = vocab_size, dim, max_len, heads
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Any = None,
        use_cache: bool = False,
    ):
        h, kh, vh = self._trunk(input_ids, attention_mask, position_ids, past_key_values)
        return types.SimpleNamespace(logits=self.head(h), past_key_values=[(kh, vh)] if use_cache else None)

    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``[B, L, dim]`` states before the head (fused cross entropy)."""
        return self._trunk(input_ids, attention_mask, position_ids, None)[0]

    def get_output_embeddings(self) -> nn.Linear:
        return self.head

    def _trunk(self, input_ids, attention_mask, position_ids, past_key_values):
        b, q = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(q, device=input_ids.device)[None].expand(b, q)
        h = self.embed(input_ids) + self.pos(position_ids.expand(b, q))
        heads, hd = self.heads, self.dim // self.heads
        w, bias = self.attn.in_proj_weight, self.attn.in_proj_bias
        qh, kh, vh = (
            F.linear(h, w[i * self.dim : (i + 1) * self.dim], bias[i * self.dim : (i + 1) * self.dim])
            .view(b, q, heads, hd)
            .transpose(1, 2)
            for i in range(3)
        )
        if past_key_values is not None:
            if (
                not isinstance(past_key_values, (list, tuple))
                or len(past_key_values) != 1
                or len(past_key_values[0]) != 2
            ):
                raise ValueError("the toy model's past_key_values is [(k, v)] (one layer)")
            pk, pv = past_key_values[0]
            kh, vh = torch.cat([pk, kh], dim=2), torch.cat([pv, vh], dim=2)
        keys = kh.shape[2]
        mask = None
        if attention_mask is not None:
            if attention_mask.dim() == 2:
                if tuple(attention_mask.shape) != (b, keys):
                    raise ValueError(f"2-D attention_mask must be [B, {keys}], got {tuple(attention_mask.shape)}")
                mask = attention_mask.bool()[:, None, None, :]
            elif attention_mask.dim() == 4 and attention_mask.dtype == torch.bool:
                mask = attention_mask
            else:
                raise ValueError("the toy model takes a 2-D key-padding mask or a 4-D bool mask")
        a = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        a = self.attn.out_proj(a.transpose(1, 2).reshape(b, q, self.dim))
        h = self.norm(h + a)
        h = h + self.mlp(h)
        return h, kh, vh


#: the capabilities of a family with an absorbing MASK token (docs/plugin-guide.md, section 5)
ABSORBING = frozenset({"mask_token", "absorbing_elbo"})


class ToyWrapper(HFDiffusionWrapper):
    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        os.makedirs(path, exist_ok=True)
        torch.save(state_dict if state_dict is not None else self.module.state_dict(), os.path.join(path, "toy.pt"))
        with open(os.path.join(path, "config.json"), "w") as fh:
            keys = ("vocab_size", "dim", "max_len", "heads")
            json.dump({"model_type": "toy", **{k: getattr(self.module, k) for k in keys}}, fh)


def make_toy_wrapper(seed: int = 0, dim: int = 32) -> ToyWrapper:
    tok = make_char_tokenizer()
    torch.manual_seed(seed)
    module = ToyDiffusionLM(len(tok), dim=dim)
    return ToyWrapper(
        family="toy",
        module=module,
        tokenizer=tok,
        kind="masked",
        mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        capabilities=ABSORBING | {"bidirectional", "kv_cache"},
    )


def load(
    path: Optional[str],
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    attn_implementation: Optional[str] = None,
) -> ToyWrapper:
    wrapper = make_toy_wrapper()
    weights = os.path.join(path or "", "toy.pt")
    if path and os.path.isfile(weights):
        wrapper.module.load_state_dict(torch.load(weights))
    wrapper.module.to(device=device, dtype=dtype)
    return wrapper


def fake_rollout(
    wrapper: Any, batch: int = 4, prompt_len: int = 6, response_len: int = 8, seed: int = 0, left_pad: int = 2
) -> RolloutBatch:
    """Random prompt/response ids (no model call), the first rows left padded by ``left_pad``."""
    g = torch.Generator().manual_seed(seed)
    low = 4  # skip special ids of the toy tokenizer
    high = min(
        60,
        wrapper.module.get_input_embeddings().num_embeddings if hasattr(wrapper.module, "get_input_embeddings") else 60,
    )
    prompt = torch.randint(low, high, (batch, prompt_len), generator=g)
    pmask = torch.ones(batch, prompt_len, dtype=torch.long)
    for b in range(0, batch, 2):
        prompt[b, :left_pad] = wrapper.pad_token_id
        pmask[b, :left_pad] = 0
    resp = torch.randint(low, high, (batch, response_len), generator=g)
    return RolloutBatch(prompt, pmask, resp, torch.ones(batch, response_len, dtype=torch.long))


@hookimpl
def dare_register_model_wrappers(register):
    # The registered family lacks ``kv_cache`` (core tests use it to check capability errors);
    # the wrapper itself has it, so cached rollouts and ``dare bench`` (which check the loaded
    # wrapper) can drive it.
    register(
        ModelFamily(
            name="toy",
            kind="masked",
            load=load,
            capabilities=ABSORBING | {"bidirectional"},
            default_checkpoint=None,
            default_rollout="low_confidence",
            rollouts=("low_confidence",),
            description="tiny family-free masked-diffusion model for tests",
        )
    )
