"""The nn toolkit's command: ``dare init`` (:mod:`dare_nn.commands`)."""

from dare_core import hookimpl


@hookimpl
def dare_register_commands(cli) -> None:
    from dare_nn.commands import init

    cli.add_command(init)
