"""The ``fsdp:`` section of the run config (read only when ``engine.name=fsdp``)."""

from __future__ import annotations

from typing import Literal

import attrs

from dare_core.api import option

SECTION = "fsdp"


@attrs.frozen
class FSDPConfig:
    """How ``engine.name=fsdp`` shards the model (PyTorch FSDP2, ``fully_shard``)."""

    reshard_after_forward: bool = option(
        True,
        "Free each decoder layer's gathered parameters after its forward and gather them "
        "again in backward (ZeRO-3 memory); false keeps them until backward (ZeRO-2: one "
        "all-gather less per layer, more memory). The root module (embeddings, head) is "
        "kept gathered between forward and backward either way.",
    )
    cpu_offload: bool = option(
        False,
        "Keep the parameter shards, gradients and optimizer state in host memory "
        "(FSDP2 CPUOffloadPolicy): the optimizer step runs on the CPU and every layer is "
        "copied to the device for its forward and backward. For models whose sharded "
        "state does not fit in device memory; slower.",
    )
    reduce_dtype: Literal["fp32", "bf16"] = option(
        "fp32",
        "Dtype in which gradients are reduce-scattered over ranks (and summed over "
        "them): fp32 (exact, also for bf16 compute) or bf16 (half the traffic, less "
        "precise sums).",
    )
