"""The ``dare bench`` command group: ``rollout``, ``rl``, ``train`` and ``engines``."""

from __future__ import annotations

import importlib
from typing import Any

import click


class _LazyGroup(click.Group):
    """Imports a subcommand (and torch) only when it is used or listed."""

    lazy = {
        "rollout": "dare_plugin_bench.rollout:rollout_cmd",
        "rl": "dare_plugin_bench.rl:rl_cmd",
        "engines": "dare_plugin_bench.engines:engines_cmd",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str):
        if name in self.lazy:
            module, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group("bench", cls=_LazyGroup)
def bench() -> None:
    """Benchmarks: a baseline and an accelerated configuration on the same checkpoint and
    inputs, interleaved in one run; a table, then one JSON line (tokens/s, step time, peak
    memory, ratios, machine info). ``engines``: weak scaling and memory per rank of the
    training engines."""


@bench.command(
    "train", context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}
)
@click.pass_context
def train_cmd(ctx: click.Context) -> None:
    """Training step speed (padded vs packed attention, naive vs fused loss); implemented by
    ``dare_plugin_bench.train:main``, which receives the remaining arguments."""
    from dare_plugin_bench.common import BenchError

    try:
        module = importlib.import_module("dare_plugin_bench.train")
    except ModuleNotFoundError as exc:
        if exc.name not in ("dare_plugin_bench.train",):
            raise
        raise BenchError(
            "`dare bench train` is not available: the module dare_plugin_bench.train is missing from this installation"
        ) from None
    main = getattr(module, "main", None)
    if main is None:
        raise BenchError("`dare bench train` is not available: dare_plugin_bench.train has no main()")
    args = list(ctx.args)
    if isinstance(main, click.Command):
        main.main(args=args, prog_name="dare bench train", standalone_mode=False)
        return
    result: Any = main(args)
    if isinstance(result, int) and result:
        ctx.exit(result)
