"""The LLaDA model wrapper: loading, token ids from the checkpoint, tiny-checkpoint creation.

LLaDA is a bidirectional masked-diffusion model whose logits are not shifted, so the shared
:class:`~dare_core.models.HFDiffusionWrapper` behaviour (identity alignment, padding passed as a
2-D key mask) is exactly LLaDA's; this module only adds loading and creation.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch

from dare_core.errors import DareError
from dare_core.models import HFDiffusionWrapper

from dare_plugin_llada.configuration_llada import LLaDAConfig
from dare_plugin_llada.hf import register_auto_classes
from dare_plugin_llada.modeling_llada import LLaDAModelLM

#: ``kv_cache``: the native module honours DARE's KV-cache contract (``past_key_values`` /
#: ``use_cache``), so cached rollouts can drive it through ``HFDiffusionWrapper.forward_cached``.
CAPABILITIES = frozenset({"bidirectional", "packed_varlen", "kv_cache"})
BUNDLED = os.path.join(os.path.dirname(__file__), "checkpoints", "tiny-sudoku")
EOT_TOKEN = "<|eot_id|>"


class LLaDAWrapper(HFDiffusionWrapper):
    """Bidirectional, unshifted: position ``i`` of the raw logits predicts token ``i``.

    ``logit_shift`` stays 0, so the base ``forward_cached`` (cached forward for accelerated
    rollouts) returns the raw logits of every new token unchanged.
    """

    #: LoRA targets: every projection of every block (the LM head ``transformer.ff_out`` is not one)
    lora_target_modules = r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"


def _check_dir(path: str) -> None:
    if not os.path.isdir(path):
        raise DareError(f"checkpoint directory {path!r} does not exist; pass model.path=DIR")
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise DareError(f"{path!r} has no config.json; it is not a Hugging Face checkpoint")
    with open(cfg_file) as fh:
        model_type = json.load(fh).get("model_type")
    if model_type != LLaDAConfig.model_type:
        raise DareError(
            f"{path!r} holds a {model_type!r} checkpoint, not {LLaDAConfig.model_type!r}; "
            f"choose the matching --model"
        )


def load(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
         attn_implementation: Optional[str] = None) -> LLaDAWrapper:
    """Load a LLaDA checkpoint (single file or sharded safetensors) and its tokenizer."""
    from transformers import AutoTokenizer

    register_auto_classes()
    _check_dir(path)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    module = LLaDAModelLM.from_pretrained(path, **kwargs).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    cfg = module.config
    if cfg.mask_token_id is None:
        raise DareError(f"{path!r}: config.json has no mask_token_id")
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.eos_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos
    stops = [eos]
    eot = tokenizer.convert_tokens_to_ids(EOT_TOKEN)
    if isinstance(eot, int) and eot != tokenizer.unk_token_id and eot is not None:
        stops.append(eot)
    return LLaDAWrapper(
        family="llada", module=module, tokenizer=tokenizer, kind="masked",
        mask_token_id=cfg.mask_token_id, eos_token_id=eos, pad_token_id=pad,
        stop_token_ids=tuple(stops), capabilities=CAPABILITIES,
    )


TINY_DEFAULTS = dict(d_model=128, n_heads=4, n_kv_heads=4, n_layers=4, mlp_hidden_size=384,
                     max_sequence_length=1024, rope_theta=10000.0, vocab_size=1024)


def create(out_dir: str, texts: list[str], **sizes: Any) -> None:
    """Write a randomly initialised LLaDA checkpoint with a BPE tokenizer trained on ``texts``.

    ``sizes`` override :data:`TINY_DEFAULTS` (config field names, e.g. ``d_model=192``);
    ``vocab_size`` is the tokenizer's target size (the embedding is rounded up to 64).
    """
    from dare_plugin_llada.tokenizer import build_tokenizer

    register_auto_classes()
    params = dict(TINY_DEFAULTS)
    unknown = set(sizes) - set(params) - set(LLaDAConfig().to_dict())
    if unknown:
        raise DareError(f"unknown LLaDA config field(s): {', '.join(sorted(unknown))}")
    params.update(sizes)
    tokenizer = build_tokenizer(texts, vocab_size=int(params.pop("vocab_size")))
    vocab = ((len(tokenizer) + 63) // 64) * 64
    config = LLaDAConfig(
        **params, vocab_size=vocab, embedding_size=vocab,
        mask_token_id=tokenizer.mask_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    model = LLaDAModelLM(config)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
