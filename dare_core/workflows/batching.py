"""Batching helpers of the loops: prompts encoded and left-padded, index chunks, the endless
shuffled batch stream, decoded responses."""

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
                f"a prompt has {len(ids)} tokens, more than trainer.max_prompt_length="
                f"{max_len}; raise trainer.max_prompt_length"
            )
        out.append(ids)
    return out


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, W]`` ids and mask, left-padded to ``width`` (0 = the longest)."""
    width = max(width, max(len(s) for s in seqs))
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


#: keys of the run's random streams (:meth:`Context.stream`)
STREAM_DATA, STREAM_ROLLOUT, STREAM_CORRUPTION, STREAM_ORDER = 1, 2, 3, 4


class BatchStream:
    """Endless global batches drawn without replacement from a fresh permutation per epoch, with
    its position as state (``state_dict`` / ``load_state_dict``) for exact resume. Every rank
    draws the same global batch; each trains on its :meth:`Engine.shard`."""

    def __init__(self, items: Sequence[Any], batch_size: int, generator: torch.Generator):
        if not items:
            raise DareError("the task produced no training examples")
        self.items, self.batch_size, self.generator = items, batch_size, generator
        self.order: list[int] = []

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> list[Any]:
        batch: list[Any] = []
        while len(batch) < self.batch_size:
            if not self.order:
                self.order = torch.randperm(len(self.items), generator=self.generator).tolist()
            batch.append(self.items[self.order.pop()])
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order = list(state["order"])
        self.generator.set_state(state["generator"])


def decode_responses(wrapper: Any, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    return [
        wrapper.decode([t for t, m in zip(ids, mask) if m]).strip()
        for ids, mask in zip(response_ids.tolist(), response_mask.tolist())
    ]
