"""Random draws on any device from the run's generator.

Runs seed one CPU ``torch.Generator`` (so a seed means the same corruption masks and data order
on every machine). A draw on another device cannot use it (``torch.rand(..., device="cuda",
generator=cpu_generator)`` is an error), and drawing ``[B, L, V]`` uniforms on the CPU to copy
them to a GPU every denoising step would cost more than the step; samplers therefore draw
through :func:`for_device`, so a seeded GPU run is reproducible too.
"""

from __future__ import annotations

from typing import Optional

import torch


def for_device(generator: Optional[torch.Generator], device: torch.device | str) -> Optional[torch.Generator]:
    """A generator that can draw on ``device``: ``generator`` when it is on that device type, else
    a new generator on ``device`` seeded from one 63-bit draw of ``generator``; ``None`` stays
    ``None`` (torch's default generators)."""
    if generator is None:
        return None
    dev = torch.device(device)
    if generator.device.type == dev.type:
        return generator
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
    return torch.Generator(device=dev).manual_seed(seed)
