"""Packed rows for block-diffusion training: several documents' ``[noisy | clean]`` BD3LM layouts
side by side in one row, no padding computed.

A padded micro-batch ``[B, L]`` (left-padded prompts, right-padded responses) holds ``B``
documents, the valid tokens of each row. Each document contributes one contiguous segment

    ``[noisy copies of its noisy blocks | clean copy of all its tokens]``

and :func:`~dare_core.ops.packing.plan_packing` (first-fit decreasing) places the segments into
rows. Positions and block ids are per document, counted from its first real token exactly as the
padded path counts them (:func:`dare_nn.block.positions_from_mask`), so the model sees the same
positions. The mask is the BD3LM mask within a document (noisy → its own noisy block and the
strictly earlier clean blocks; clean → clean blocks ``≤`` its own) and nothing across documents;
filler slots at a row's end attend only to themselves.

A noisy block is one in which some noisy token differs from the clean one. The noisy copies of
the other blocks are left out: such a copy sees exactly what its clean copy sees, so its output is
read from the clean copy (the per-document form of :func:`dare_nn.block.bd3lm_compact_layout`).
The result equals the padded BD3LM forward at every valid position, up to float rounding.
"""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from dare_core.api import plan_packing
from dare_nn.block import block_index, positions_from_mask


@attrs.frozen(eq=False)
class BlockPacking:
    """The packed BD3LM input of a padded micro-batch and where each valid token's output is.

    Attributes:
        input_ids, position_ids: ``[rows, width]`` long.
        mask: ``[rows, 1, width, width]`` bool, True = may attend.
        where: ``(batch, column)`` index tensors ``[T]`` of the valid tokens (row-major order).
        source: ``[T]`` flat index (``row * width + slot``) of the packed output each valid token
            reads: its noisy copy in a noisy block, else its clean copy.
        padded_slots: slots of the padded compact layout (``B * (2L - c0)``, ``c0`` the first
            column of a noisy block in any row), what packing is weighed against.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor
    where: tuple[torch.Tensor, torch.Tensor]
    source: torch.Tensor
    padded_slots: int

    @property
    def slots(self) -> int:
        return int(self.input_ids.numel())

    def outputs(self, out: torch.Tensor) -> torch.Tensor:
        """``[T, *]`` outputs of the valid tokens from the module's ``[rows, width, *]`` output."""
        return out.reshape((-1,) + tuple(out.shape[2:]))[self.source]


def bd3lm_packed_mask(doc_ids: torch.Tensor, clean: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``[R, 1, W, W]`` BD3LM mask within documents: ``doc_ids`` ``[R, W]`` (``-1`` on filler),
    ``clean`` ``[R, W]`` True on clean copies, ``block_ids`` ``[R, W]``."""
    bq, bk = block_ids[:, :, None], block_ids[:, None, :]
    qc, kc = clean[:, :, None], clean[:, None, :]
    rule = torch.where(qc, kc & (bk <= bq), torch.where(kc, bk < bq, bk == bq))
    real = doc_ids >= 0
    allowed = rule & (doc_ids[:, :, None] == doc_ids[:, None, :]) & real[:, :, None]
    eye = torch.eye(doc_ids.shape[1], dtype=torch.bool, device=doc_ids.device)[None]
    return (allowed | (eye & ~real[:, :, None]))[:, None]


def pack_bd3lm(
    noisy_ids: torch.Tensor,
    clean_ids: torch.Tensor,
    block_size: int,
    attention_mask: Optional[torch.Tensor],
    fill_id: int,
) -> BlockPacking:
    """Pack the ``[noisy | clean]`` layouts of the documents of a padded ``[B, L]`` batch
    (``attention_mask`` 1 on valid tokens, ``None``: all valid); filler slots hold ``fill_id``."""
    if noisy_ids.shape != clean_ids.shape:
        raise ValueError(f"noisy and clean ids differ in shape: {tuple(noisy_ids.shape)} vs {tuple(clean_ids.shape)}")
    b, length = noisy_ids.shape
    dev = noisy_ids.device
    valid = torch.ones(b, length, dtype=torch.bool, device=dev) if attention_mask is None else attention_mask.bool()
    pos = positions_from_mask(valid, (b, length), dev)
    blocks = block_index(pos, block_size)
    hot = torch.zeros(b, length + 1, dtype=torch.bool, device=dev)
    differs = (noisy_ids != clean_ids) & valid
    hot.scatter_(1, torch.where(differs, blocks, torch.full_like(blocks, length)), True)
    noisy = hot.gather(1, blocks) & valid  # [B, L]: position lies in a noisy block of its document
    plan = plan_packing(torch.cat([noisy, valid], 1))  # each document: noisy copies, then clean
    cols = torch.arange(length, device=dev)
    c0 = int(torch.where(noisy, cols, length).min()) if noisy.numel() else 0
    ids = plan.pack(torch.cat([noisy_ids, clean_ids], 1), fill_id)
    positions = plan.pack(torch.cat([pos, pos], 1))
    clean = plan.position_ids >= length  # "padded" positions: the column in [noisy | clean]
    mask = bd3lm_packed_mask(plan.doc_ids, clean, block_index(positions, block_size))
    flat = torch.full((b, 2 * length), -1, dtype=torch.long, device=dev)
    flat[plan.src_batch, plan.src_col] = plan.dst_row * plan.width + plan.dst_slot
    in_batch, in_column = torch.nonzero(valid, as_tuple=True)
    where = (in_batch, in_column)
    source = torch.where(noisy[where], flat[where], flat[where[0], where[1] + length])
    return BlockPacking(ids, positions, mask, where, source, b * (2 * length - c0))
