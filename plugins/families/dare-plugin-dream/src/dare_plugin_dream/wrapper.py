"""The Dream model wrapper: the logit shift, loading, token ids from the checkpoint, creation.

Dream keeps Qwen's autoregressive alignment: the raw logit at position ``i`` predicts token
``i + 1``. :meth:`DreamWrapper.align` undoes that so that, as everywhere in DARE, aligned
position ``i`` predicts token ``i``::

    aligned[:, i] = raw[:, i - 1]   for i >= 1
    aligned[:, 0] = raw[:, 0]       (position 0 has no left neighbour; Dream's generation and SFT
                                      code duplicate the first output, and position 0 is always a
                                      prompt token, never a prediction target)

With a 2-D padding mask, a valid position whose left neighbour is padding (the first token of a
left-padded prompt) is treated like position 0 and keeps its own raw logit, so a padded row gets
exactly the aligned logits of the same row without padding (the reference removes padding before
its forward, which gives the same result). The first response position ``P`` always reads the raw
logit of ``P - 1``, the last prompt token.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dare_core.api import DareError, HFDiffusionWrapper
from dare_nn.checkpoints import (
    config_or_tokenizer_id,
    load_module,
    padded_vocab_size,
    save_new_checkpoint,
    tiny_params,
    tokenizer_token_id,
)
from dare_plugin_dream.config import BUNDLED, CAPABILITIES  # noqa: F401 (BUNDLED: re-exported)
from dare_plugin_dream.configuration_dream import DreamConfig
from dare_plugin_dream.hf import register_auto_classes
from dare_plugin_dream.modeling_dream import DreamModel

IM_END_TOKEN = "<|im_end|>"


def shift_logits(raw: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dream's shift along dim 1: ``out[:, 0] = raw[:, 0]``, ``out[:, i] = raw[:, i - 1]``.

    With a 2-D ``attention_mask`` ``[B, L]`` (0 = padding), positions whose left neighbour is
    padding keep their own raw logit (they start a sequence, like position 0).
    """
    if raw.shape[1] == 0:
        return raw
    out = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
    if attention_mask is not None and attention_mask.dim() == 2 and raw.shape[1] > 1:
        valid = attention_mask.to(raw.device).bool()
        starts = torch.zeros_like(valid)
        starts[:, 1:] = valid[:, 1:] & ~valid[:, :-1]
        out = torch.where(starts[..., None], raw, out)
    return out


class DreamWrapper(HFDiffusionWrapper):
    """Bidirectional masked diffusion with AR-aligned raw logits (``logit_shift = 1``)."""

    #: a cached query must start this many positions before the first position whose aligned
    #: logit is wanted (aligned logit ``i`` is the raw logit of ``i - 1``)
    logit_shift = 1

    def align(self, logits: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Aligned logits (position ``i`` predicts token ``i``); see :func:`shift_logits`."""
        return shift_logits(logits, attention_mask)

    def logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        mask = self._padding_mask(attention_mask)
        return self.align(self._raw_logits(input_ids, mask), mask)

    def denoise_hidden(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Aligned final hidden states (fused cross entropy): the same shift as :meth:`logits`."""
        mask = self._padding_mask(attention_mask)
        return self.align(self.module.forward_hidden(noisy_ids, attention_mask=mask), mask)

    # ``forward_cached`` is the core's: with ``logit_shift = 1`` it returns the raw logits
    # ``[:, :Q-1]``, i.e. the aligned logits of ``input_ids[:, 1:]``.


def load(
    path: str, dtype: torch.dtype = torch.float32, device: str = "cpu", attn_implementation: Optional[str] = None
) -> DreamWrapper:
    """Load a Dream checkpoint (single file or sharded safetensors) and its tokenizer."""
    register_auto_classes()
    module, tokenizer = load_module(DreamModel, path, dtype, device, attn_implementation, DreamConfig.model_type)
    cfg = module.config
    mask = config_or_tokenizer_id(cfg.mask_token_id, tokenizer.mask_token_id)
    if mask is None:
        raise DareError(f"{path!r}: neither config.json nor the tokenizer names a mask token (mask_token_id)")
    eos = config_or_tokenizer_id(cfg.eos_token_id, tokenizer.eos_token_id)
    if eos is None:
        raise DareError(f"{path!r}: neither config.json nor the tokenizer names an EOS token (eos_token_id)")
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos
    stops = [eos]
    if isinstance(cfg.eos_token_id, (list, tuple)):
        stops += [int(t) for t in cfg.eos_token_id[1:]]
    im_end = tokenizer_token_id(tokenizer, IM_END_TOKEN)
    if im_end is not None and im_end not in stops:
        stops.append(im_end)
    return DreamWrapper(
        family="dream",
        module=module,
        tokenizer=tokenizer,
        kind="masked",
        mask_token_id=int(mask),
        eos_token_id=int(eos),
        pad_token_id=int(pad),
        stop_token_ids=tuple(stops),
        capabilities=CAPABILITIES,
    )


TINY_DEFAULTS = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rope_theta=10000.0,
    vocab_size=1024,
)


def create(out_dir: str, texts: list[str], **sizes: Any) -> None:
    """Write a randomly initialised Dream checkpoint with a BPE tokenizer trained on ``texts``.

    ``sizes`` override :data:`TINY_DEFAULTS` (config field names, e.g. ``hidden_size=96``);
    ``vocab_size`` is the tokenizer's target size (the embedding is rounded up to 64 rows).
    """
    from dare_plugin_dream.tokenizer import build_tokenizer

    register_auto_classes()
    params = tiny_params(TINY_DEFAULTS, sizes, DreamConfig().to_dict(), "Dream")
    tokenizer = build_tokenizer(texts, vocab_size=int(params.pop("vocab_size")))
    vocab = padded_vocab_size(tokenizer)
    try:
        config = DreamConfig(
            **params,
            vocab_size=vocab,
            mask_token_id=tokenizer.mask_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.eos_token_id,
        )
    except (ValueError, TypeError) as exc:
        raise DareError(f"invalid Dream size overrides: {exc}") from None
    save_new_checkpoint(out_dir, DreamModel(config), tokenizer)
