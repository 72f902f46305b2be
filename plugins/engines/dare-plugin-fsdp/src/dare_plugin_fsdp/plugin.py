"""The plugin's manifest: the ``fsdp`` engine (its module imported when it is built) and the
``fsdp:`` config section."""

from dare_core.api import ConfigSection, EngineSpec, hookimpl, lazy
from dare_plugin_fsdp.config import SECTION, FSDPConfig


@hookimpl
def dare_register_engines(register):
    register(
        EngineSpec(
            "fsdp",
            lazy("dare_plugin_fsdp.engine:build_fsdp"),
            "one process per device, parameters/gradients/optimizer state sharded over ranks (FSDP2)",
            distributed=True,
        )
    )


@hookimpl
def dare_register_config_sections(register):
    register(ConfigSection(SECTION, FSDPConfig, "Sharding options of engine.name=fsdp (dare-plugin-fsdp)."))
