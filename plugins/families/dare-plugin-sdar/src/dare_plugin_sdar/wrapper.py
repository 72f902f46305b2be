"""The SDAR model wrapper: block-causal inference, BD3LM training layout, KV cache, loading, creation.

SDAR (dense ``sdar`` and MoE ``sdar_moe``) is a block-diffusion model: at inference a query in block
``b`` (``position // block_size``, positions counted from the first real token) attends to keys in
blocks ``≤ b``; in training the input is ``[noisy | clean]`` with the BD3LM mask and the loss reads
the noisy half's logits (BD3LM, arXiv:2503.09573; SDAR, arXiv:2510.06303). Logits are not shifted.
The wrapper builds these masks with :mod:`dare_nn.block`, so algorithms never see the
difference.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch

from dare_core.api import DareError
from dare_nn.block import BlockDiffusionWrapper
from dare_nn.checkpoints import (
    checkpoint_model_type,
    config_or_tokenizer_id,
    load_module,
    padded_vocab_size,
    save_new_checkpoint,
    tiny_params,
    tokenizer_token_id,
)
from dare_plugin_sdar.config import BUNDLED, CAPABILITIES, DEFAULT_BLOCK_SIZE  # noqa: F401 (BUNDLED: re-exported)
from dare_plugin_sdar.configuration_sdar import SDARConfig, SDARMoeConfig
from dare_plugin_sdar.hf import register_auto_classes
from dare_plugin_sdar.modeling_sdar import SDARForCausalLM
from dare_plugin_sdar.modeling_sdar_moe import SDARMoeForCausalLM

IM_END = "<|im_end|>"
MASK_TOKENS = ("<|MASK|>", "<MASK>")
_CLASSES = {SDARConfig.model_type: SDARForCausalLM, SDARMoeConfig.model_type: SDARMoeForCausalLM}


class SDARWrapper(BlockDiffusionWrapper):
    """Block-causal inference, ``[noisy | clean]`` BD3LM training, unshifted logits (the shared
    :class:`~dare_nn.block.BlockDiffusionWrapper`); SDAR adds its prompt rendering and
    generation config."""

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        """Qwen3 chat template with thinking disabled (SDAR's chat evaluation setting)."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )

    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        super().save_pretrained(path, state_dict)
        gen = {"eos_token_id": list(self.stop_token_ids), "pad_token_id": self.pad_token_id}
        with open(os.path.join(path, "generation_config.json"), "w") as fh:
            json.dump(gen, fh, indent=2)


def token_ids(path: str, config: Any, tokenizer: Any) -> dict[str, Any]:
    """mask / eos / pad / stop ids from the checkpoint (config, generation_config.json, tokenizer)."""
    mask = config_or_tokenizer_id(getattr(config, "mask_token_id", None), tokenizer.mask_token_id)
    if mask is None:
        mask = next((t for t in (tokenizer_token_id(tokenizer, m) for m in MASK_TOKENS) if t is not None), None)
    if mask is None:
        raise DareError(f"{path!r}: neither config.json (mask_token_id) nor the tokenizer names a mask token")
    eos = config_or_tokenizer_id(config.eos_token_id, tokenizer.eos_token_id)
    if eos is None:
        raise DareError(f"{path!r}: no eos_token_id in config.json or the tokenizer")
    stops: list[int] = []
    gen_file = os.path.join(path, "generation_config.json")
    gen: dict[str, Any] = {}
    if os.path.isfile(gen_file):
        with open(gen_file) as fh:
            gen = json.load(fh)
        g = gen.get("eos_token_id")
        stops = [int(t) for t in (g if isinstance(g, list) else [g] if g is not None else [])]
    if not stops:
        stops = [t for t in (tokenizer_token_id(tokenizer, IM_END), eos) if t is not None]
    pad = config.pad_token_id
    if pad is None:
        pad = gen.get("pad_token_id", tokenizer.pad_token_id)
    if pad is None:
        pad = eos
    return {
        "mask_token_id": int(mask),
        "eos_token_id": int(eos),
        "pad_token_id": int(pad),
        "stop_token_ids": tuple(dict.fromkeys(stops)),
    }


def load(
    path: str, dtype: torch.dtype = torch.float32, device: str = "cpu", attn_implementation: Optional[str] = None
) -> SDARWrapper:
    """Load an ``sdar`` or ``sdar_moe`` checkpoint (single file or sharded safetensors) and its tokenizer."""
    register_auto_classes()
    model_type = checkpoint_model_type(path, _CLASSES)
    module, tokenizer = load_module(_CLASSES[model_type], path, dtype, device, attn_implementation)
    ids = token_ids(path, module.config, tokenizer)
    block = getattr(module.config, "block_size", None) or DEFAULT_BLOCK_SIZE
    return SDARWrapper(
        family="sdar",
        module=module,
        tokenizer=tokenizer,
        kind="block",
        capabilities=CAPABILITIES,
        block_size=int(block),
        **ids,
    )


TINY_DENSE = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_hidden_layers=2,
    intermediate_size=128,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    block_size=4,
    vocab_size=512,
)
# like SDAR-30B-A3B's config: no block_size / mask_token_id (the wrapper uses 4 and the tokenizer's mask)
TINY_MOE = {k: v for k, v in TINY_DENSE.items() if k != "block_size"}
TINY_MOE.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def create(out_dir: str, texts: list[str], **sizes: Any) -> None:
    """Write a randomly initialised SDAR checkpoint with a BPE tokenizer trained on ``texts``.

    ``sizes`` override the tiny defaults with published config field names (e.g. ``hidden_size=96``);
    ``model_type=sdar_moe`` writes an SDAR-MoE checkpoint (then ``num_experts``,
    ``num_experts_per_tok``, ``moe_intermediate_size`` ... apply too). ``vocab_size``
    is the tokenizer's target size (the embedding is rounded up to a multiple of 64).
    """
    from dare_plugin_sdar.tokenizer import IM_END as IM_END_TOKEN
    from dare_plugin_sdar.tokenizer import build_tokenizer

    register_auto_classes()
    model_type = str(sizes.pop("model_type", SDARConfig.model_type))
    if model_type not in _CLASSES:
        raise DareError(f"model_type must be one of {', '.join(sorted(_CLASSES))}, got {model_type!r}")
    moe = model_type == SDARMoeConfig.model_type
    config_cls = SDARMoeConfig if moe else SDARConfig
    params = tiny_params(TINY_MOE if moe else TINY_DENSE, sizes, config_cls().to_dict(), model_type)
    tokenizer = build_tokenizer(texts, vocab_size=int(params.pop("vocab_size")))
    vocab = padded_vocab_size(tokenizer)
    eos = tokenizer.eos_token_id
    # like the published configs: no pad_token_id (so no frozen padding row in the embedding);
    # the pad id comes from the tokenizer / generation_config.json
    ids = {} if moe else {"mask_token_id": tokenizer.mask_token_id}
    config = config_cls(**params, vocab_size=vocab, eos_token_id=eos, bos_token_id=eos, **ids)
    save_new_checkpoint(out_dir, _CLASSES[model_type](config), tokenizer)
    stops = [tokenizer.convert_tokens_to_ids(IM_END_TOKEN), eos]
    with open(os.path.join(out_dir, "generation_config.json"), "w") as fh:
        json.dump({"eos_token_id": stops, "pad_token_id": tokenizer.pad_token_id}, fh, indent=2)
