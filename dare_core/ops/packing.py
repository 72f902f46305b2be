"""Packing the valid tokens of a padded batch into rows without padding.

A padded batch ``[B, S]`` (left-padded prompts, right-padded responses, ``attention_mask`` 1 on
valid tokens) holds ``B`` documents: the valid tokens of each row. :func:`plan_packing` places
the documents into as few rows as possible (first-fit decreasing, row capacity ``S`` by default)
so that the forward pass only processes valid tokens. Every packed token keeps a document id,
and attention is restricted to the token's own document (a block-diagonal mask), so each
document sees exactly the keys it sees in the padded forward.

Position ids are per document: ``positions="padded"`` (default) gives every token its column in
the padded batch, so packed and padded forwards compute the same function for any position
encoding; ``"restart"`` counts ``0, 1, ...`` from each document's first token (equal results for
relative encodings such as RoPE, up to rounding).

Slots at the end of a row that hold no document are *filler*: they carry the fill id, document
id ``-1``, attend only to themselves and are dropped when unpacking.
"""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from dare_core.ops.attention import DocumentMask, cu_seqlens, document_mask


@attrs.frozen
class PackPlan:
    """Where each valid token of the padded batch goes.

    Attributes:
        batch_shape: ``(B, S)`` of the padded batch.
        rows, width: packed shape ``[rows, width]``.
        src_batch, src_col: ``[T]`` padded coordinates of the ``T`` valid tokens.
        dst_row, dst_slot: ``[T]`` their packed coordinates.
        doc_ids: ``[rows, width]`` long, the source row of each slot (``-1`` on filler).
        position_ids: ``[rows, width]`` long.
        doc_lengths: ``[B]`` number of valid tokens per source row.
    """

    batch_shape: tuple[int, int]
    rows: int
    width: int
    src_batch: torch.Tensor
    src_col: torch.Tensor
    dst_row: torch.Tensor
    dst_slot: torch.Tensor
    doc_ids: torch.Tensor
    position_ids: torch.Tensor
    doc_lengths: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.src_batch.numel())

    @property
    def fill_ratio(self) -> float:
        """Valid tokens over packed slots."""
        return self.num_tokens / max(1, self.rows * self.width)

    def pack(self, values: torch.Tensor, fill=0) -> torch.Tensor:
        """``values`` ``[B, S, *]`` → ``[rows, width, *]`` (filler slots hold ``fill``)."""
        out = values.new_full((self.rows, self.width) + tuple(values.shape[2:]), fill)
        out[self.dst_row, self.dst_slot] = values[self.src_batch, self.src_col]
        return out

    def unpack(self, values: torch.Tensor, fill=0) -> torch.Tensor:
        """``values`` ``[rows, width, *]`` → ``[B, S, *]`` (padding positions hold ``fill``);
        differentiable with respect to ``values``."""
        b, s = self.batch_shape
        out = values.new_full((b, s) + tuple(values.shape[2:]), fill)
        return out.index_put((self.src_batch, self.src_col), values[self.dst_row, self.dst_slot])

    def attention_mask(self, kernel: str = "sdpa_mask"):
        """The packed rows' attention mask for a model: with ``sdpa_mask`` a boolean ``[rows, 1, width,
        width]``, True where query and key share a document (filler slots attend only to themselves);
        with another kernel a :class:`~dare_core.ops.attention.DocumentMask` for it."""
        if kernel == "sdpa_mask":
            return document_mask(self.doc_ids)
        return DocumentMask(self.doc_ids, kernel)

    def segments(self) -> torch.Tensor:
        """``cu_seqlens`` (int32, ``[n+1]``) over the row-major flattening of the packed rows,
        each filler slot its own segment: the input of varlen attention kernels."""
        return cu_seqlens(self.doc_ids)[0]

    def to(self, device) -> "PackPlan":
        return attrs.evolve(
            self,
            **{
                f.name: getattr(self, f.name).to(device)
                for f in attrs.fields(PackPlan)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )


def plan_packing(attention_mask: torch.Tensor, capacity: Optional[int] = None, positions: str = "padded") -> PackPlan:
    """Plan the packing of the valid tokens of each row of ``attention_mask`` ``[B, S]``: longest
    first into the first row with room (first-fit decreasing), at most ``capacity`` (default ``S``)
    per row; the packed width is the fullest row's length."""
    if attention_mask.dim() != 2:
        raise ValueError(f"packing needs a 2-D [B, S] attention mask, got {tuple(attention_mask.shape)}")
    if positions not in ("padded", "restart"):
        raise ValueError(f"positions must be 'padded' or 'restart', got {positions!r}")
    valid = attention_mask.detach().to("cpu").bool()
    b, s = valid.shape
    cap = s if capacity is None else int(capacity)
    lengths = valid.sum(1)
    if lengths.numel() and int(lengths.max()) > cap:
        raise ValueError(f"a sequence has {int(lengths.max())} tokens, more than the row capacity {cap}")
    order = sorted(range(b), key=lambda i: (-int(lengths[i]), i))
    fills: list[int] = []
    place: dict[int, tuple[int, int]] = {}
    for i in order:
        n = int(lengths[i])
        if n == 0:
            continue
        for r, used in enumerate(fills):
            if used + n <= cap:
                place[i] = (r, used)
                fills[r] = used + n
                break
        else:
            place[i] = (len(fills), 0)
            fills.append(n)
    rows = max(1, len(fills))
    width = max(fills) if fills else 1
    doc_ids = torch.full((rows, width), -1, dtype=torch.long)
    pos = torch.zeros((rows, width), dtype=torch.long)
    coords = []  # per document: source rows, source columns, packed rows, packed slots
    for i, (r, start) in sorted(place.items()):
        cols = torch.nonzero(valid[i]).flatten()
        n = cols.numel()
        coords.append((torch.full((n,), i), cols, torch.full((n,), r), torch.arange(start, start + n)))
        doc_ids[r, start : start + n] = i
        pos[r, start : start + n] = cols if positions == "padded" else torch.arange(n)
    flat = [torch.cat(xs) for xs in zip(*coords)] if coords else [torch.zeros(0, dtype=torch.long)] * 4
    src_batch, src_col, dst_row, dst_slot = flat
    plan = PackPlan((b, s), rows, width, src_batch, src_col, dst_row, dst_slot, doc_ids, pos, lengths.long())
    return plan.to(attention_mask.device) if attention_mask.device.type != "cpu" else plan
