"""The evaluation suite: ``dare eval`` (many tasks, one model load; accuracy, pass@k, maj@k,
per-item samples in an eval directory). Registering it imports neither torch nor model code."""

from __future__ import annotations

from dare_core.api import hookimpl


@hookimpl
def dare_register_commands(cli) -> None:
    from dare_plugin_eval.command import eval_cmd

    cli.add_command(eval_cmd)
