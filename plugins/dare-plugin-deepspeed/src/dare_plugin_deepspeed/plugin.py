"""The plugin's manifest: only ``@hookimpl`` functions.

* ``dare_register_engines`` — the ``deepspeed`` engine (``engine.name=deepspeed``; one process per
  device, started by the ``deepspeed`` launcher or ``torchrun``);
* ``dare_register_config_sections`` — the ``deepspeed:`` section (ZeRO stage, offloading, a
  DeepSpeed JSON config).

``deepspeed`` itself is imported when the engine is built, so listing and configuring cost nothing.
"""

from dare_core.api import ConfigSection, EngineSpec, hookimpl

from dare_plugin_deepspeed.config import SECTION, DeepSpeedConfig
from dare_plugin_deepspeed.engine import build


@hookimpl
def dare_register_engines(register):
    register(EngineSpec(
        "deepspeed", build,
        "DeepSpeed ZeRO stage 1/2/3 (deepspeed.zero_stage), bf16 with fp32 master weights, optional "
        "CPU offload; one process per device (deepspeed or torchrun launcher)",
        distributed=True))


@hookimpl
def dare_register_config_sections(register):
    register(ConfigSection(SECTION, DeepSpeedConfig,
                           "The deepspeed engine: ZeRO stage, CPU offload, a DeepSpeed JSON config "
                           "(dare-plugin-deepspeed)."))
