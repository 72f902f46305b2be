"""Attention layouts for block diffusion (semi-autoregressive) families.

Block-diffusion models denoise one block of ``block_size`` tokens at a time, attending
bidirectionally inside the block and causally across blocks. Every such family needs the same
three things, so they live here once:

* :func:`positions_from_mask` — position ids that start at 0 on the first real token of a
  left-padded row;
* :func:`block_causal_mask` — the inference mask: a query in block ``b`` sees keys in blocks
  ``≤ b`` (arXiv:2510.06303; docs/block_diffusion.md);
* :func:`bd3lm_layout` — the training layout ``[noisy | clean]`` with the BD3LM mask
  (Arriola et al., "Block Diffusion", arXiv:2503.09573; docs/block_diffusion.md):

  ============  ======================================  ==================================
  query \\ key   noisy                                   clean
  ============  ======================================  ==================================
  noisy         same block only (bidirectional)         strictly earlier blocks
  clean         never                                   same or earlier blocks
  ============  ======================================  ==================================

Masks are boolean ``[B, 1, Q, K]`` with ``True`` = may attend, the form SDPA and the native
modules accept. Padded keys are never visible; a padded query sees only itself, so no softmax
row is empty (its output is garbage by design and must be ignored by the caller).
Block ids come from positions (``position // block_size``, blocks counted from the first real
token) unless the caller passes its own (e.g. blocks restarted at the response start).
"""

from __future__ import annotations

from typing import Optional

import torch

from dare_core.api import DareError, HFDiffusionWrapper, fused_token_logprobs, gather_logprobs


def positions_from_mask(attention_mask: Optional[torch.Tensor], shape: tuple[int, int], device=None) -> torch.Tensor:
    """``[B, L]`` position ids: ``0, 1, …`` from the first real token; padding gets 0.

    ``attention_mask`` is a 2-D ``[B, L]`` mask (1 = real token) or ``None`` (no padding).
    """
    B, L = shape
    if attention_mask is None:
        return torch.arange(L, device=device).expand(B, L).clone()
    m = attention_mask.to(torch.long)
    return (m.cumsum(-1) - 1).clamp_min(0) * m


def block_index(position_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block id of every position: ``position // block_size``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return torch.div(position_ids, block_size, rounding_mode="floor")


def _valid(attention_mask: Optional[torch.Tensor], shape, device) -> torch.Tensor:
    if attention_mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if attention_mask.dim() != 2:
        raise ValueError(f"expected a 2-D [batch, length] padding mask, got shape {tuple(attention_mask.shape)}")
    return attention_mask.bool()


def _finish(allowed: torch.Tensor, q_valid: torch.Tensor, k_valid: torch.Tensor) -> torch.Tensor:
    """Hide padded keys; let padded queries see only their own slot (no empty softmax rows)."""
    allowed = allowed & k_valid[:, None, :]
    Q, K = allowed.shape[-2:]
    if Q == K:
        eye = torch.eye(Q, dtype=torch.bool, device=allowed.device)[None]
        allowed = torch.where(q_valid[:, :, None], allowed, eye)
    return allowed[:, None]


def block_causal_mask(
    block_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    key_block_ids: Optional[torch.Tensor] = None,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Inference mask ``[B, 1, Q, K]``: query in block ``b`` sees (real) keys in blocks ``≤ b``.

    :param block_ids: ``[B, Q]`` block id of each query (see :func:`block_index`).
    :param attention_mask: ``[B, Q]`` 1 for real query tokens (``None``: all real).
    :param key_block_ids: ``[B, K]`` block ids of the keys; defaults to the queries' (self-attention
        over the same tokens). Pass it when the keys include a KV cache.
    :param key_mask: ``[B, K]`` 1 for real keys; defaults to ``attention_mask`` when the keys are
        the queries.
    """
    kb = block_ids if key_block_ids is None else key_block_ids
    q_valid = _valid(attention_mask, block_ids.shape, block_ids.device)
    if key_block_ids is None:
        k_valid = q_valid if key_mask is None else _valid(key_mask, kb.shape, kb.device)
    else:
        k_valid = _valid(key_mask, kb.shape, kb.device)
    allowed = kb[:, None, :] <= block_ids[:, :, None]
    return _finish(allowed, q_valid, k_valid)


def bd3lm_mask(block_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The ``[B, 1, 2L, 2L]`` BD3LM mask for the layout ``[noisy (L) | clean (L)]``.

    ``block_ids`` ``[B, L]`` are the block ids of the L positions (shared by both halves).
    """
    B, L = block_ids.shape
    bq = block_ids[:, :, None]
    bk = block_ids[:, None, :]
    noisy_noisy = bq == bk
    noisy_clean = bk < bq
    clean_clean = bk <= bq
    clean_noisy = torch.zeros_like(noisy_noisy)
    top = torch.cat([noisy_noisy, noisy_clean], dim=-1)
    bottom = torch.cat([clean_noisy, clean_clean], dim=-1)
    allowed = torch.cat([top, bottom], dim=-2)
    valid = _valid(attention_mask, (B, L), block_ids.device)
    valid2 = torch.cat([valid, valid], dim=-1)
    return _finish(allowed, valid2, valid2)


def bd3lm_layout(
    noisy_ids: torch.Tensor,
    clean_ids: torch.Tensor,
    block_size: int,
    attention_mask: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
    block_ids: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build the block-diffusion training input.

    Returns ``(input_ids [B, 2L], position_ids [B, 2L], mask [B, 1, 2L, 2L])``: the noisy copy
    followed by the clean copy, positions duplicated, and :func:`bd3lm_mask`. The logits the
    loss needs are those of the first ``L`` positions (the noisy half).
    """
    if noisy_ids.shape != clean_ids.shape:
        raise ValueError(f"noisy and clean ids differ in shape: {tuple(noisy_ids.shape)} vs {tuple(clean_ids.shape)}")
    B, L = noisy_ids.shape
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask, (B, L), noisy_ids.device)
    if block_ids is None:
        block_ids = block_index(position_ids, block_size)
    ids = torch.cat([noisy_ids, clean_ids], dim=-1)
    pos = torch.cat([position_ids, position_ids], dim=-1)
    return ids, pos, bd3lm_mask(block_ids, attention_mask)


def bd3lm_compact_layout(
    noisy_ids: torch.Tensor,
    clean_ids: torch.Tensor,
    block_size: int,
    attention_mask: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """:func:`bd3lm_layout` without the noisy copies of the leading blocks that hold no noise.

    A noisy block equal to its clean block sees exactly what the clean copy sees (its own block and
    the earlier clean blocks), so its logits equal the clean half's at the same positions. The
    noisy columns before ``c0`` — the start column of the first block (in any row) whose noisy and
    clean tokens differ — are therefore dropped (in SFT and RL these are the prompt blocks), and
    every position of a noise-free block takes the clean half's output.

    Returns ``(input_ids [B, L - c0 + L], position_ids, mask, c0, noisy_block [B, L] bool)``;
    rebuild the ``[B, L, ...]`` noisy-half output with :func:`bd3lm_compact_output`.
    """
    B, L = noisy_ids.shape
    dev = noisy_ids.device
    pos = positions_from_mask(attention_mask, (B, L), dev)
    blocks = block_index(pos, block_size)
    valid = _valid(attention_mask, (B, L), dev)
    differs = (noisy_ids != clean_ids) & valid
    has = torch.zeros(B, L + 1, dtype=torch.bool, device=dev)
    has.scatter_(1, torch.where(differs, blocks, torch.full_like(blocks, L)), True)
    noisy_block = has.gather(1, blocks) & valid  # position's block holds some noise
    cols = torch.arange(L, device=dev).expand(B, L)
    first = torch.where(noisy_block, cols, torch.full_like(cols, L)).amin(dim=1)
    c0 = int(first.min().item()) if B else 0
    ids, positions, mask = bd3lm_layout(noisy_ids, clean_ids, block_size, attention_mask, pos, blocks)
    if c0 == 0:
        return ids, positions, mask, 0, noisy_block
    keep = torch.cat([torch.arange(c0, L), torch.arange(L, 2 * L)]).to(dev)
    mask = mask.index_select(2, keep).index_select(3, keep)
    return ids[:, keep], positions[:, keep], mask, c0, noisy_block


def bd3lm_compact_output(out: torch.Tensor, length: int, c0: int, noisy_block: torch.Tensor) -> torch.Tensor:
    """Noisy-half outputs ``[B, L, ...]`` from the outputs of :func:`bd3lm_compact_layout`'s input:
    positions in noise-free blocks take the clean half's output, the others the noisy copy's."""
    kept = length - c0
    clean = out[:, kept : kept + length]
    noisy = torch.cat([clean[:, :c0], out[:, :kept]], dim=1)
    sel = noisy_block.reshape(noisy_block.shape + (1,) * (out.dim() - 2))
    return torch.where(sel, noisy, clean)


def _batch_shape(ids: torch.Tensor) -> tuple[int, int]:
    """``(B, L)`` of a ``[B, L]`` id tensor."""
    batch, length = ids.shape
    return batch, length


def block_causal_inputs(
    attention_mask: Optional[torch.Tensor], shape: tuple[int, int], block_size: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(position_ids, mask)`` of the block-causal inference forward of a ``[B, L]`` batch:
    :func:`positions_from_mask` and :func:`block_causal_mask` over their blocks."""
    pos = positions_from_mask(attention_mask, shape, device)
    return pos, block_causal_mask(block_index(pos, block_size), attention_mask)


class BlockDiffusionWrapper(HFDiffusionWrapper):
    """A block-diffusion wrapper whose native module takes 4-D boolean masks, positions and
    the KV-cache contract: block-causal inference (:meth:`logits`), the compact BD3LM
    ``[noisy | clean]`` training layout (:meth:`denoise_logits`, :meth:`denoise_hidden`), its
    packed form (:meth:`token_logprobs` under ``train_attention = "packed"``) and a cached
    forward that passes its mask through unchanged. Logits are not shifted."""

    logit_shift = 0

    def supports_packing(self) -> bool:
        """The ``packed_varlen`` capability: the module takes position ids and 4-D boolean masks,
        all the packed BD3LM rows of :mod:`dare_nn.block_packing` need."""
        return "packed_varlen" in self.capabilities

    @property
    def attention_kernel(self) -> str:
        """Packed BD3LM rows carry a boolean mask through the module's SDPA: ``sdpa_mask`` only."""
        return "sdpa_mask"

    @attention_kernel.setter
    def attention_kernel(self, kernel: str) -> None:
        if kernel != "sdpa_mask":
            raise DareError(
                f"model.attention_kernel={kernel}: packed block-diffusion rows use the BD3LM "
                f"boolean mask through SDPA only; use model.attention_kernel=sdpa_mask or auto"
            )

    def token_logprobs(
        self,
        noisy_ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """``log p(targets | noisy)`` under the BD3LM layout, ``[B, S]`` float32. With
        ``train_attention = "packed"`` the documents' layouts are packed into rows
        (:func:`~dare_nn.block_packing.pack_bd3lm`; the same values at valid positions, 0 at
        padding) unless the packed rows hold more than ``packing_max_slots`` of the padded
        layout's slots."""
        if self.train_attention == "packed" and attention_mask is not None and attention_mask.dim() == 2:
            from dare_nn.block_packing import pack_bd3lm

            pack = pack_bd3lm(
                noisy_ids,
                noisy_ids if clean_ids is None else clean_ids,
                self.block_size,
                attention_mask,
                self.pad_token_id,
            )
            if pack.slots <= self.packing_max_slots * pack.padded_slots:
                return self._packed_bd3lm_logprobs(pack, targets)
        if self.fused_ce:
            hidden = self.denoise_hidden(noisy_ids, attention_mask, clean_ids)
            weight, bias, scale = self.output_head()
            return fused_token_logprobs(
                hidden, weight, targets, bias, scale=scale, chunk_elements=self.ce_chunk_elements
            )
        return gather_logprobs(self.denoise_logits(noisy_ids, attention_mask, clean_ids), targets)

    def _packed_bd3lm_logprobs(self, pack, targets: torch.Tensor) -> torch.Tensor:
        """One forward over the packed rows; ``log p`` of the valid tokens put back at their
        padded coordinates."""
        kw = dict(attention_mask=pack.mask, position_ids=pack.position_ids)
        if self.fused_ce:
            rows = pack.outputs(self.module.forward_hidden(pack.input_ids, **kw))
            weight, bias, scale = self.output_head()
            picked = fused_token_logprobs(
                rows, weight, targets[pack.where], bias, scale=scale, chunk_elements=self.ce_chunk_elements
            )
        else:
            rows = pack.outputs(self.module(input_ids=pack.input_ids, **kw).logits)
            picked = gather_logprobs(rows, targets[pack.where])
        return picked.new_zeros(targets.shape).index_put(pack.where, picked)

    def logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Block-causal forward; ``attention_mask`` is the 2-D ``[B, L]`` padding mask (left padding)."""
        pos, mask = block_causal_inputs(attention_mask, _batch_shape(input_ids), self.block_size, input_ids.device)
        return self.module(input_ids=input_ids, attention_mask=mask, position_ids=pos).logits

    def denoise_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """Logits of the noisy half of ``[noisy | clean]`` under the BD3LM mask (block ids from
        positions counted from the first real token, the global origin).

        Without ``clean_ids`` the clean half would be the input itself, for which the noisy
        half's logits are those of the block-causal inference forward, so :meth:`logits` is
        used. Leading blocks without noise (the prompt) are not duplicated
        (:func:`bd3lm_compact_layout`: their noisy logits equal the clean half's), which
        leaves the result unchanged.
        """
        if clean_ids is None:
            return self.logits(noisy_ids, attention_mask)
        ids, pos, mask, c0, noisy = bd3lm_compact_layout(noisy_ids, clean_ids, self.block_size, attention_mask)
        out = self.module(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        return bd3lm_compact_output(out, noisy_ids.shape[1], c0, noisy)

    def denoise_hidden(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Final hidden states (head not applied) of what :meth:`denoise_logits` computes; lets
        the core's logits-free fused cross entropy run on the ``[noisy | clean]`` layout."""
        if clean_ids is None:
            pos, mask = block_causal_inputs(attention_mask, _batch_shape(noisy_ids), self.block_size, noisy_ids.device)
            return self.module.forward_hidden(noisy_ids, attention_mask=mask, position_ids=pos)
        ids, pos, mask, c0, noisy = bd3lm_compact_layout(noisy_ids, clean_ids, self.block_size, attention_mask)
        out = self.module.forward_hidden(ids, attention_mask=mask, position_ids=pos)
        return bd3lm_compact_output(out, noisy_ids.shape[1], c0, noisy)

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        past_key_values=None,
        attention_mask: Optional[torch.Tensor] = None,
        use_cache: bool = True,
    ):
        """One cached forward (the DARE KV-cache contract); returns ``(logits, present)``."""
        out = self.module(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        return out.logits, out.past_key_values
