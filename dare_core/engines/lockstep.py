"""Lockstep generation (docs/engines.md, "Lockstep"). Under an engine whose forwards are collectives
(:attr:`~dare_core.interfaces.Engine.collective_forwards`: parameters gathered per forward) every
rank must issue the same number of model forwards, while a rollout backend stops when its rows are
done (thresholds, stop tokens): the number of forwards is data-dependent. The rule of transformers'
``generate(synced_gpus=True)``: before each forward of ``wrapper.module`` every rank says whether
it still decodes (one all-reduce, :meth:`Engine.any_active`); a rank that has finished keeps
issuing forwards of its first prompt row, results discarded, until no rank decodes. Backends need
nothing but to run every model forward through ``wrapper.module`` (the rollout-backend contract)."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import torch

_COLLECTIVE = contextvars.ContextVar("dare_lockstep_collective", default=False)


def collective_generation() -> bool:
    """Whether the generation under way steps in lockstep over collective forwards (a backend
    whose forwards cannot all run through ``wrapper.module`` refuses it)."""
    return _COLLECTIVE.get()


@contextlib.contextmanager
def lockstep(engine: Any, wrapper: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> Iterator[None]:
    """Generation of ``wrapper`` inside this block on ``prompt_ids`` / ``prompt_mask`` (``[B, P]``)
    steps in lockstep over ``engine``'s ranks; a no-op (no collective) unless the engine's forwards
    are collective and it has several ranks. Collective then: every rank enters it equally often."""
    if not (engine.collective_forwards and engine.world_size > 1):
        yield
        return

    def step(*_: Any) -> None:  # before every forward: this rank still decodes
        engine.any_active(True)

    hook = wrapper.module.register_forward_pre_hook(step, prepend=True)
    token = _COLLECTIVE.set(True)
    try:
        yield
    finally:
        _COLLECTIVE.reset(token)
        hook.remove()
    with torch.no_grad():
        while engine.any_active(False):  # another rank still decodes: the same forwards, discarded
            wrapper.logits(prompt_ids[:1], prompt_mask[:1])
