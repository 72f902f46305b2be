"""Batching helpers of the loops: prompts encoded and left-padded, index chunks, endless
shuffled batches, decoded responses."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from dare_core.errors import DareError
from dare_core.interfaces import Example


def encode_prompts(wrapper: Any, examples: Sequence[Example], max_len: int) -> list[list[int]]:
    out = []
    for ex in examples:
        ids = wrapper.encode(wrapper.render_prompt(ex.prompt))
        if len(ids) > max_len:
            raise DareError(
                f"a prompt has {len(ids)} tokens, more than trainer.max_prompt_length={max_len}; "
                f"raise trainer.max_prompt_length"
            )
        out.append(ids)
    return out


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def cycle_batches(items: Sequence[Any], batch_size: int, generator: torch.Generator) -> Iterator[list[Any]]:
    """Endless batches drawn without replacement from a fresh permutation per epoch."""
    if not items:
        raise DareError("the task produced no training examples")
    order: list[int] = []
    while True:
        batch = []
        while len(batch) < batch_size:
            if not order:
                order = torch.randperm(len(items), generator=generator).tolist()
            batch.append(items[order.pop()])
        yield batch


def decode_responses(wrapper: Any, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    texts = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        valid = [t for t, m in zip(ids, mask) if m]
        texts.append(wrapper.decode(valid).strip())
    return texts
