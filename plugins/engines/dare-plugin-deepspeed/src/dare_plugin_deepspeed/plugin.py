"""The plugin's manifest: only ``@hookimpl`` functions.

* ``dare_register_engines`` — the ``deepspeed`` engine (``engine.name=deepspeed``; one process per
  device, started by the ``deepspeed`` launcher or ``torchrun``);
* ``dare_register_config_sections`` — the ``deepspeed:`` section (ZeRO stage, offloading, a
  DeepSpeed JSON config);
* ``dare_configure`` — DeepSpeed's CPU accelerator for a run on a machine without CUDA.

The engine module (torch) and ``deepspeed`` itself are imported when the engine is built, so
listing and configuring cost nothing.
"""

import os

from dare_core.api import ConfigSection, EngineSpec, hookimpl, lazy
from dare_plugin_deepspeed.config import SECTION, DeepSpeedConfig


@hookimpl
def dare_register_engines(register):
    register(
        EngineSpec(
            "deepspeed",
            lazy("dare_plugin_deepspeed.engine:build"),
            "DeepSpeed ZeRO stage 1/2/3 (deepspeed.zero_stage), bf16 with fp32 master weights, optional "
            "CPU offload; one process per device (deepspeed or torchrun launcher)",
            distributed=True,
        )
    )


@hookimpl
def dare_register_config_sections(register):
    register(
        ConfigSection(
            SECTION,
            DeepSpeedConfig,
            "The deepspeed engine: ZeRO stage, CPU offload, a DeepSpeed JSON config (dare-plugin-deepspeed).",
        )
    )


@hookimpl
def dare_configure(config):
    """A run on a machine without CUDA selects DeepSpeed's CPU accelerator before anything imports
    ``deepspeed``: transformers imports it when it saves a checkpoint (its accelerate integration,
    whatever the engine), and DeepSpeed's auto-detection then prints a warning on stdout."""
    import sys

    if "deepspeed" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
