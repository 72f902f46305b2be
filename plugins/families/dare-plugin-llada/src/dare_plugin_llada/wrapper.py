"""The LLaDA model wrapper: loading, token ids from the checkpoint, tiny-checkpoint creation.

LLaDA is a bidirectional masked-diffusion model whose logits are not shifted, so the shared
:class:`~dare_core.models.base.HFDiffusionWrapper` behaviour (identity alignment, padding passed as a
2-D key mask) is exactly LLaDA's; this module only adds loading and creation.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dare_core.api import DareError, HFDiffusionWrapper
from dare_nn.checkpoints import load_module, padded_vocab_size, save_new_checkpoint, tiny_params, tokenizer_token_id
from dare_plugin_llada.config import BUNDLED, CAPABILITIES  # noqa: F401 (BUNDLED: re-exported)
from dare_plugin_llada.configuration_llada import LLaDAConfig
from dare_plugin_llada.hf import register_auto_classes
from dare_plugin_llada.modeling_llada import LLaDAModelLM

EOT_TOKEN = "<|eot_id|>"


class LLaDAWrapper(HFDiffusionWrapper):
    """Bidirectional, unshifted: position ``i`` of the raw logits predicts token ``i``.

    ``logit_shift`` stays 0, so the base ``forward_cached`` (cached forward for accelerated
    rollouts) returns the raw logits of every new token unchanged.
    """

    #: LoRA targets: every projection of every block (the LM head ``transformer.ff_out`` is not one)
    lora_target_modules = r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"


def load(
    path: str, dtype: torch.dtype = torch.float32, device: str = "cpu", attn_implementation: Optional[str] = None
) -> LLaDAWrapper:
    """Load a LLaDA checkpoint (single file or sharded safetensors) and its tokenizer."""
    register_auto_classes()
    module, tokenizer = load_module(LLaDAModelLM, path, dtype, device, attn_implementation, LLaDAConfig.model_type)
    cfg = module.config
    if cfg.mask_token_id is None:
        raise DareError(f"{path!r}: config.json has no mask_token_id")
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.eos_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos
    stops = [eos]
    eot = tokenizer_token_id(tokenizer, EOT_TOKEN)
    if eot is not None:
        stops.append(eot)
    return LLaDAWrapper(
        family="llada",
        module=module,
        tokenizer=tokenizer,
        kind="masked",
        mask_token_id=cfg.mask_token_id,
        eos_token_id=eos,
        pad_token_id=pad,
        stop_token_ids=tuple(stops),
        capabilities=CAPABILITIES,
    )


TINY_DEFAULTS = dict(
    d_model=128,
    n_heads=4,
    n_kv_heads=4,
    n_layers=4,
    mlp_hidden_size=384,
    max_sequence_length=1024,
    rope_theta=10000.0,
    vocab_size=1024,
)


def create(out_dir: str, texts: list[str], **sizes: Any) -> None:
    """Write a randomly initialised LLaDA checkpoint with a BPE tokenizer trained on ``texts``.

    ``sizes`` override :data:`TINY_DEFAULTS` (config field names, e.g. ``d_model=192``);
    ``vocab_size`` is the tokenizer's target size (the embedding is rounded up to 64).
    """
    from dare_plugin_llada.tokenizer import build_tokenizer

    register_auto_classes()
    params = tiny_params(TINY_DEFAULTS, sizes, LLaDAConfig().to_dict(), "LLaDA")
    tokenizer = build_tokenizer(texts, vocab_size=int(params.pop("vocab_size")))
    vocab = padded_vocab_size(tokenizer)
    config = LLaDAConfig(
        **params,
        vocab_size=vocab,
        embedding_size=vocab,
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    save_new_checkpoint(out_dir, LLaDAModelLM(config), tokenizer)
