"""The optimizer of a run (AdamW with warm-up and the configured schedule) and the clipped
step that skips non-finite gradients."""

from __future__ import annotations

import math
from typing import Any

import torch

from dare_core.config import RunConfig
from dare_core.errors import DareError


def make_optimizer(params, config: RunConfig) -> tuple[torch.optim.Optimizer, Any]:
    tr = config.trainer
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise DareError("the model has no trainable parameters")
    opt = torch.optim.AdamW(
        trainable, lr=tr.lr, betas=(tr.beta1, tr.beta2), eps=tr.adam_eps, weight_decay=tr.weight_decay
    )
    warmup = int(round(tr.warmup_ratio * tr.steps))

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if tr.lr_schedule == "cosine":
            progress = (step - warmup) / max(1, tr.steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def clip_and_step(params, optimizer, max_norm: float) -> tuple[float, bool]:
    """Clip the global grad norm; skip the step (and zero grads) when the norm is not finite."""
    trainable = [p for p in params if p.requires_grad and p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm)
    else:
        norm = torch.linalg.vector_norm(
            torch.stack([p.grad.detach().float().norm() for p in trainable])
        ) if trainable else torch.zeros(())
    finite = bool(torch.isfinite(norm))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm), finite
