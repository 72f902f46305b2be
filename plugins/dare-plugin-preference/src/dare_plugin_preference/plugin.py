"""Registers the ``preference`` workflow (the ``dare`` entry point of dare-plugin-preference)."""

from __future__ import annotations

from dare_core.api import WorkflowSpec, hookimpl


@hookimpl
def dare_register_workflows(register):
    from dare_plugin_preference.workflow import run_preference

    register(WorkflowSpec("preference", run_preference,
                          "pairwise preference optimisation on (prompt, chosen, rejected) pairs"))
