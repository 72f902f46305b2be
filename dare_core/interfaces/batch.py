"""Tensor containers shared by every seam.

Shapes: B batch, P (padded) prompt length, R response length, S = P + R, M Monte-Carlo samples.
Prompts are left padded, responses right padded, so position ``P`` is always the first response
token. ``attention_mask`` marks valid tokens (1) and padding (0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import attrs

if TYPE_CHECKING:
    import torch


def _index(value: Any, idx: torch.Tensor, dim: int) -> Any:
    import torch

    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.index_select(dim, idx.to(value.device))
    if isinstance(value, list):
        return [value[i] for i in idx.tolist()]
    raise TypeError(f"cannot index {type(value).__name__}")


@attrs.define
class SequenceBatch:
    """``[prompt | response]`` token ids with their validity mask.

    Attributes:
        input_ids: ``[B, S]`` long.
        attention_mask: ``[B, S]`` long, 1 on valid tokens.
        prompt_len: ``P``, the padded prompt length (responses start at column ``P``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int

    @property
    def response_ids(self) -> torch.Tensor:
        """``[B, R]`` the response columns of ``input_ids``."""
        return self.input_ids[:, self.prompt_len :]

    @property
    def response_mask(self) -> torch.Tensor:
        """``[B, R]`` the response columns of ``attention_mask``."""
        return self.attention_mask[:, self.prompt_len :]

    @property
    def prompt_mask(self) -> torch.Tensor:
        """``[B, P]`` the prompt columns of ``attention_mask``."""
        return self.attention_mask[:, : self.prompt_len]

    @property
    def batch_size(self) -> int:
        """``B``, the number of rows."""
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> "SequenceBatch":
        """Some rows.

        Args:
            idx: ``[k]`` long row indices.

        Returns:
            the ``[k, S]`` batch of those rows, same ``prompt_len``.
        """
        return SequenceBatch(_index(self.input_ids, idx, 0), _index(self.attention_mask, idx, 0), self.prompt_len)

    def to(self, device: torch.device | str) -> "SequenceBatch":
        """The batch on ``device``."""
        return SequenceBatch(self.input_ids.to(device), self.attention_mask.to(device), self.prompt_len)


@attrs.define
class RolloutBatch:
    """What a rollout backend returns.

    Attributes:
        prompt_ids: ``[B, P]`` left-padded prompts.
        prompt_mask: ``[B, P]``.
        response_ids: ``[B, R]`` generated tokens (MASKs left at the end replaced by EOS).
        response_mask: ``[B, R]`` tokens that count as the response (backend's rule, see docs).
        reveal_step: ``[B, R]`` long, the global denoising step (0-based) at which each response
            token was committed; recorded when ``"reveal_step"`` was requested, else ``None``.
        num_steps: number of denoising steps ``K`` the rollout ran (for ``reveal_step``).
        nfe: number of model forward calls used.
        extras: backend-specific records (e.g. intermediate states) keyed by record name.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    reveal_step: Optional[torch.Tensor] = None
    num_steps: int = 0
    nfe: int = 0
    extras: dict[str, Any] = attrs.field(factory=dict)

    def sequences(self) -> SequenceBatch:
        """The ``[B, S]`` ``[prompt | response]`` rows (``S = P + R``, ``prompt_len = P``) with
        the prompt and response masks as the attention mask."""
        import torch

        return SequenceBatch(
            torch.cat([self.prompt_ids, self.response_ids], dim=1),
            torch.cat([self.prompt_mask, self.response_mask], dim=1).long(),
            self.prompt_ids.shape[1],
        )


@attrs.define
class Corrupted:
    """Output of a forward corruption process, drawn once per rollout batch.

    Attributes:
        noisy_ids: ``[M, B, S]`` ids with corrupted positions replaced by the mask token.
        masked: ``[M, B, S]`` bool, positions that were corrupted (the likelihood targets).
        p_mask: ``[M, B, S]`` float, probability with which each position was masked
            (0 on padding), used for the ``1/p`` ELBO weights.
        extras: process-specific tensors with the batch on dim 1 (e.g. per-row ``t``).
    """

    noisy_ids: torch.Tensor
    masked: torch.Tensor
    p_mask: torch.Tensor
    extras: dict[str, torch.Tensor] = attrs.field(factory=dict)

    @property
    def num_samples(self) -> int:
        """``M``, the number of Monte-Carlo rows."""
        return self.noisy_ids.shape[0]

    def select(self, idx: torch.Tensor) -> "Corrupted":
        """Some sequences (dim 1 of every member and extra).

        Args:
            idx: ``[k]`` long indices of sequences.

        Returns:
            the ``[M, k, S]`` corruption of those sequences.
        """
        return Corrupted(
            _index(self.noisy_ids, idx, 1),
            _index(self.masked, idx, 1),
            _index(self.p_mask, idx, 1),
            {k: _index(v, idx, 1) for k, v in self.extras.items()},
        )

    def select_samples(self, rows: Sequence[int]) -> "Corrupted":
        """Some Monte-Carlo rows (dim 0).

        Args:
            rows: indices of Monte-Carlo rows.

        Returns:
            the ``[len(rows), B, S]`` corruption; extras whose first dimension is ``M`` are
            selected too, the others are kept as they are.
        """
        import torch

        idx = torch.as_tensor(list(rows), dtype=torch.long)
        m = self.num_samples

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, idx.to(t.device))

        extras = {
            k: pick(v) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == m else v
            for k, v in self.extras.items()
        }
        return Corrupted(pick(self.noisy_ids), pick(self.masked), pick(self.p_mask), extras)
