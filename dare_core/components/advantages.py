"""Advantage estimators over groups of rollouts of the same prompt."""

from __future__ import annotations

import torch


class GroupNormAdvantage:
    r"""Group-normalised advantage (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300).

    .. math:: A_i = (r_i - \bar r_g) / (\sigma_g + ε)

    with the *unbiased* group standard deviation ``σ_g`` (``norm_by_std=True``) or
    ``A_i = r_i - \bar r_g`` otherwise. A singleton group has mean 0 and std 1; an all-equal
    group gets 0. Groups are found by id, so the batch order does not matter.
    """

    def __init__(self, norm_by_std: bool = True, eps: float = 1e-6):
        self.norm_by_std = norm_by_std
        self.eps = eps

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        rewards = rewards.to(torch.float32)
        out = torch.empty_like(rewards)
        for g in group_ids.unique():
            sel = group_ids == g
            r = rewards[sel]
            if r.numel() == 1:
                mean, std = torch.zeros(()), torch.ones(())
            else:
                mean, std = r.mean(), r.std(unbiased=True)
            out[sel] = (r - mean) / (std + self.eps) if self.norm_by_std else r - mean
        return out


class RLOOAdvantage:
    r"""Leave-one-out baseline (RLOO; Ahmadian et al. 2024, arXiv:2402.14740).

    .. math:: A_i = r_i - \frac{1}{n-1}\sum_{j\ne i} r_j = \frac{n}{n-1}(r_i - \bar r_g)

    A group of one (no other rollout to leave out) has baseline 0: ``A_i = r_i``, as verl's and
    the DARE reference's ``compute_rloo_outcome_advantage``, also inside a batch of larger groups.
    Groups are found by id, so the batch order does not matter.
    """

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        rewards = rewards.to(torch.float32)
        out = rewards.clone()
        for g in group_ids.unique():
            sel = group_ids == g
            n = int(sel.sum())
            if n > 1:
                r = rewards[sel]
                out[sel] = (r - r.mean()) * n / (n - 1)
        return out
