"""Registers the ``preference`` workflow and its ``preference:`` config section (the ``dare``
entry point of dare-plugin-preference)."""

from __future__ import annotations

from dare_core.api import ConfigSection, PreferenceComponents, WorkflowSpec, hookimpl, lazy
from dare_plugin_preference.config import SECTION, PreferenceConfig


@hookimpl
def dare_register_workflows(register):
    register(
        WorkflowSpec(
            "preference",
            lazy("dare_plugin_preference.workflow:run_preference"),
            "pairwise preference optimisation on (prompt, chosen, rejected) pairs",
            components=PreferenceComponents,
        )
    )


@hookimpl
def dare_register_config_sections(register):
    register(
        ConfigSection(
            SECTION, PreferenceConfig, "Preference pairs of the preference workflow (dare-plugin-preference)."
        )
    )
