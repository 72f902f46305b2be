"""Registers the ``preference`` workflow and its ``preference:`` config section (the ``dare``
entry point of dare-plugin-preference)."""

from __future__ import annotations

from dare_core.api import ConfigSection, WorkflowSpec, hookimpl

from dare_plugin_preference.config import SECTION, PreferenceConfig


@hookimpl
def dare_register_workflows(register):
    from dare_plugin_preference.workflow import run_preference

    register(WorkflowSpec("preference", run_preference,
                          "pairwise preference optimisation on (prompt, chosen, rejected) pairs"))


@hookimpl
def dare_register_config_sections(register):
    register(ConfigSection(SECTION, PreferenceConfig,
                           "Preference pairs of the preference workflow (dare-plugin-preference)."))
