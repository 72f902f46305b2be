"""The LLaDA2 model wrapper: block-causal inference, the BD3LM training layout, loading, creation.

LLaDA2 is a block-diffusion model (``kind = "block"``): at inference a query in block ``b`` sees
the keys of blocks ``<= b`` (blocks of ``block_size`` tokens counted from the first real token),
and training uses the ``[noisy | clean]`` layout with the BD3LM mask (arXiv:2503.09573,
arXiv:2512.15745). Both masks come from :mod:`dare_nn.block`; the raw module never
gets a missing mask. Logits are not shifted. Inference logits, the packed training rows and
``token_logprobs`` are the shared :class:`~dare_nn.block.BlockDiffusionWrapper`'s; the padded
training layout (:meth:`LLaDA2Wrapper._layout`) and the cached forward are LLaDA2's own.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dare_core.api import DareError
from dare_nn import layers
from dare_nn.block import BlockDiffusionWrapper, bd3lm_layout, block_causal_mask, block_index, positions_from_mask
from dare_nn.checkpoints import config_or_tokenizer_id, load_module, padded_vocab_size, save_new_checkpoint, tiny_params
from dare_plugin_llada2.config import BUNDLED, CAPABILITIES, DEFAULT_BLOCK_SIZE  # noqa: F401 (BUNDLED: re-exported)
from dare_plugin_llada2.configuration_llada2_moe import LLaDA2MoeConfig
from dare_plugin_llada2.hf import register_auto_classes
from dare_plugin_llada2.modeling_llada2_moe import LLaDA2MoeModelLM


class LLaDA2Wrapper(BlockDiffusionWrapper):
    """Block-causal, unshifted: position ``i`` of the logits predicts token ``i``."""

    #: drop noisy-copy blocks that equal their clean blocks from the training layout (exact)
    compact_layout = True

    def _module_logits(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.module(input_ids=ids, attention_mask=mask, position_ids=pos).logits

    def _layout(
        self, noisy_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], clean_ids: Optional[torch.Tensor]
    ) -> tuple:
        """The ``[noisy | clean]`` input, its positions and mask, and where each output comes from.

        With ``compact_layout`` (default) the noisy copy keeps only the columns lying in a block
        in which some row's noisy tokens differ from its clean ones. This is exact: a noisy query
        in a block equal to its clean block sees the same keys with the same states as the clean
        query at that position (its own block of clean tokens and the earlier clean blocks), so
        its output is read from the clean copy instead. Returns ``(ids, pos, mask, src)`` with
        ``src`` ``[B, L]`` the column of the model output that position ``i`` uses.
        """
        clean = noisy_ids if clean_ids is None else clean_ids
        mask2d = self._padding_mask(attention_mask)
        b, length = noisy_ids.shape
        if not self.compact_layout:
            ids, pos, mask = bd3lm_layout(noisy_ids, clean, self.block_size, mask2d)
            return ids, pos, mask, torch.arange(length, device=ids.device).expand(b, length)
        dev = noisy_ids.device
        valid = torch.ones(b, length, dtype=torch.bool, device=dev) if mask2d is None else mask2d.bool()
        pos = positions_from_mask(mask2d, (b, length), dev)
        blk = block_index(pos, self.block_size)
        differs = (noisy_ids != clean) & valid
        n_blocks = int(blk.max()) + 1 if length else 1
        hot = torch.zeros(b, n_blocks, dtype=torch.bool, device=dev)
        hot.scatter_reduce_(1, blk, differs, reduce="amax")
        needed = hot.gather(1, blk) & valid  # [B, L]: positions whose noisy output differs
        keep = needed.any(dim=0).nonzero(as_tuple=True)[0]  # noisy columns kept (shared by rows)
        n = keep.numel()
        nb, npos, nvalid = blk[:, keep], pos[:, keep], valid[:, keep]
        ids = torch.cat([noisy_ids[:, keep], clean], dim=1)
        positions = torch.cat([npos, pos], dim=1)
        kv = torch.cat([nvalid, valid], dim=1)
        q_noisy_k_noisy = nb[:, :, None] == nb[:, None, :]
        q_noisy_k_clean = blk[:, None, :] < nb[:, :, None]
        q_clean_k_clean = blk[:, None, :] <= blk[:, :, None]
        top = torch.cat([q_noisy_k_noisy, q_noisy_k_clean], dim=2)
        bottom = torch.cat([torch.zeros(b, length, n, dtype=torch.bool, device=dev), q_clean_k_clean], dim=2)
        allowed = torch.cat([top, bottom], dim=1) & kv[:, None, :]
        eye = torch.eye(n + length, dtype=torch.bool, device=dev)[None]
        allowed = torch.where(kv[:, :, None], allowed, eye)  # padded queries see only themselves
        slot = torch.full((length,), -1, dtype=torch.long, device=dev)
        slot[keep] = torch.arange(n, device=dev)
        clean_src = n + torch.arange(length, device=dev).expand(b, length)
        src = torch.where(needed, slot.expand(b, length), clean_src)
        return ids, positions, allowed[:, None], src

    def denoise_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """Logits of the noisy half of ``[noisy | clean]`` under the BD3LM mask.

        ``clean_ids`` defaults to ``noisy_ids`` (exact when they hold no MASK, e.g. scoring a
        clean sequence). Padding (``attention_mask`` 0) is never attended; blocks are counted
        from each row's first real token. See :meth:`_layout` for the compact form.
        """
        ids, pos, mask, src = self._layout(noisy_ids, attention_mask, clean_ids)
        out = self._module_logits(ids, mask, pos)
        return out.gather(1, src[..., None].expand(-1, -1, out.shape[-1]))

    def denoise_hidden(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Final hidden states of the noisy half (what :meth:`denoise_logits` feeds the head)."""
        ids, pos, mask, src = self._layout(noisy_ids, attention_mask, clean_ids)
        out = self.module.forward_hidden(ids, attention_mask=mask, position_ids=pos)
        return out.gather(1, src[..., None].expand(-1, -1, out.shape[-1]))

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        past_key_values: Optional[list] = None,
        attention_mask: Optional[torch.Tensor] = None,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, Optional[list]]:
        """One forward over new tokens with an optional KV cache (the shared cache contract).

        ``attention_mask``: ``None`` -> every cached key is visible (the cache holds earlier
        blocks) and the new tokens attend block-causally among themselves by ``position_ids``;
        a 2-D ``[B, P + Q]`` key-padding mask is combined with that rule; a 4-D
        ``[B, 1, Q, P + Q]`` mask is used as is. Returns float32 logits ``[B, Q, V]`` (no
        shift) and, when ``use_cache``, the extended cache.
        """
        b, q = input_ids.shape
        p = 0 if not past_key_values else int(past_key_values[0][0].shape[2])
        if attention_mask is None or attention_mask.dim() == 2:
            own = block_causal_mask(block_index(position_ids.expand(b, q), self.block_size))
            mask = torch.cat([torch.ones(b, 1, q, p, dtype=torch.bool, device=input_ids.device), own], dim=-1)
            if attention_mask is not None:
                if tuple(attention_mask.shape) != (b, p + q):
                    raise DareError(
                        f"forward_cached: a 2-D mask must be [B, P + Q] = {(b, p + q)}, "
                        f"got {tuple(attention_mask.shape)}"
                    )
                mask = mask & attention_mask.bool()[:, None, None, :]
        else:
            mask = attention_mask
        out = self.module(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=past_key_values or None,
            use_cache=use_cache,
        )
        return out.logits, (layers.output_cache(out) if use_cache else None)


def load(
    path: str,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    attn_implementation: Optional[str] = None,
    block_size: Optional[int] = None,
) -> LLaDA2Wrapper:
    """Load an LLaDA2 checkpoint (single-file or sharded safetensors) and its tokenizer.

    Token ids: ``mask_token_id`` / ``eos_token_id`` / ``pad_token_id`` from config.json, else the
    tokenizer's mask / eos / pad tokens. ``block_size``: the argument, else config.json's
    ``block_size`` entry, else :data:`DEFAULT_BLOCK_SIZE`.
    """
    register_auto_classes()
    module, tokenizer = load_module(
        LLaDA2MoeModelLM, path, dtype, device, attn_implementation, LLaDA2MoeConfig.model_type
    )
    cfg = module.config
    mask = config_or_tokenizer_id(getattr(cfg, "mask_token_id", None), tokenizer.mask_token_id)
    eos = config_or_tokenizer_id(cfg.eos_token_id, tokenizer.eos_token_id)
    pad = config_or_tokenizer_id(cfg.pad_token_id, tokenizer.pad_token_id)
    if pad is None:
        pad = eos
    if mask is None or eos is None:
        raise DareError(
            f"{path!r}: neither config.json nor the tokenizer names the mask and eos tokens; "
            f"add mask_token_id / eos_token_id to config.json"
        )
    size = int(block_size or getattr(cfg, "block_size", None) or DEFAULT_BLOCK_SIZE)
    if size <= 0:
        raise DareError(f"block_size must be positive, got {size}")
    return LLaDA2Wrapper(
        family="llada2",
        module=module,
        tokenizer=tokenizer,
        kind="block",
        mask_token_id=mask,
        eos_token_id=eos,
        pad_token_id=pad,
        stop_token_ids=(eos,),
        capabilities=CAPABILITIES,
        block_size=size,
    )


TINY_DEFAULTS = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    num_experts=4,
    num_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    rope_theta=10000.0,
    max_position_embeddings=1024,
    vocab_size=1024,
)


def create(out_dir: str, texts: list[str], **sizes: Any) -> None:
    """Write a randomly initialised LLaDA2-MoE checkpoint with a BPE tokenizer trained on ``texts``.

    ``sizes`` override :data:`TINY_DEFAULTS` (config field names, e.g. ``hidden_size=96``;
    ``block_size=N`` is stored in config.json for the wrapper); ``vocab_size`` is the
    tokenizer's target size (the embedding is rounded up to 64 rows).
    """
    from dare_plugin_llada2.tokenizer import build_tokenizer

    register_auto_classes()
    params = tiny_params(TINY_DEFAULTS, sizes, {*LLaDA2MoeConfig().to_dict(), "block_size"}, "LLaDA2")
    tokenizer = build_tokenizer(texts, vocab_size=int(params.pop("vocab_size")))
    vocab = padded_vocab_size(tokenizer)
    if "rotary_dim" not in sizes:
        params["rotary_dim"] = int(params["head_dim"] * params.get("partial_rotary_factor", 0.5))
    config = LLaDA2MoeConfig(
        **params,
        vocab_size=vocab,
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    save_new_checkpoint(out_dir, LLaDA2MoeModelLM(config), tokenizer)
