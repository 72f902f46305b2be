"""Reporting commands: ``dare compare`` (paired comparison of checkpoints on the same prompts) and
``dare plot`` (learning curves)."""

from __future__ import annotations

from dare_core.api import hookimpl


@hookimpl
def dare_register_commands(cli) -> None:
    from dare_plugin_report.commands import compare, plot

    cli.add_command(compare)
    cli.add_command(plot)
