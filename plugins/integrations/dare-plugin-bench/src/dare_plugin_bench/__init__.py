"""``dare bench``: baseline against accelerated configurations, interleaved in one run."""

from __future__ import annotations

from dare_core.api import hookimpl


@hookimpl
def dare_register_commands(cli) -> None:
    from dare_plugin_bench.cli import bench

    cli.add_command(bench)
