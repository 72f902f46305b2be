"""The ``dare`` command line. User errors (:class:`~dare_core.errors.DareError`) are printed as
one ``error:`` line and exit with status 2; no traceback.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Optional

import click

from dare_core._version import __version__
from dare_core.console import QUIET_ENV
from dare_core.errors import DareError
from dare_core.scaffold import KINDS

if TYPE_CHECKING:
    from dare_core.plugins import Dare


def _dare():
    """The process-wide plugin manager; the first call warns once per broken plugin."""
    from dare_core.plugins import get_dare

    dare = get_dare()
    for info in dare.broken():
        if info.name not in _WARNED:
            _WARNED.add(info.name)
            click.echo(f"warning: {info.broken_message()}", err=True)
    return dare


_WARNED: set[str] = set()


def _fail(exc: DareError) -> None:
    """One ``error:`` line and exit status 2; with ``DARE_DEBUG=1`` the traceback instead."""
    if os.environ.get("DARE_DEBUG") == "1":
        raise exc
    click.echo(f"error: {exc}", err=True)
    sys.exit(exc.exit_status)


class DareGroup(click.Group):
    """A click group that turns user errors into one line and loads plugin commands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:  # undecodable bytes arrive as lone surrogates (PEP 383)
            if any("\ud800" <= ch <= "\udfff" for ch in arg):
                try:
                    shown = os.fsencode(arg)  # the bytes as given
                except UnicodeEncodeError:
                    shown = arg.encode("utf-8", "backslashreplace")
                _fail(DareError(f"argument {shown!r} is not valid UTF-8; pass text encoded as UTF-8"))
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DareError as exc:
            _fail(exc)
        except click.UsageError as exc:  # click's usage block, as one line
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            _fail(DareError(f"{exc.format_message().rstrip('.')} (see `{where} --help`)"))
        except KeyboardInterrupt:  # before click turns it into "Aborted!" and status 1
            click.echo("error: interrupted", err=True)
            sys.exit(130)

    def _load_plugin_commands(self) -> None:
        if getattr(self, "_plugins_loaded", False):
            return
        self._plugins_loaded = True
        try:
            self._add_plugin_commands(_dare())
        except DareError as exc:
            _fail(exc)

    def _add_plugin_commands(self, dare: Dare) -> None:
        """Call each plugin's ``dare_register_commands`` in turn (registration order) and
        refuse a command name that a built-in or an earlier plugin already uses; a hook that
        raises marks its plugin broken and adds nothing."""
        owners = {name: "dare-core" for name in self.commands}
        for impl in dare.pm.hook.dare_register_commands.get_hookimpls():
            before = dict(self.commands)
            try:
                impl.function(cli=self)
            except Exception as exc:
                if os.environ.get("DARE_DEBUG") == "1":
                    raise
                self.commands = before
                from dare_core.plugins import one_line

                dare.disable(impl.plugin_name, f"dare_register_commands raised {one_line(exc)}")
                _dare()  # its warning
                continue
            for name, cmd in list(self.commands.items()):
                if name not in before:
                    owners[name] = impl.plugin_name
                elif before[name] is not cmd:
                    self.commands[name] = before[name]
                    raise DareError(
                        f"plugin {impl.plugin_name!r} adds the command {name!r}, which "
                        f"{owners.get(name, 'another plugin')!r} already provides; disable one of "
                        f"them (DARE_DISABLE_PLUGINS={impl.plugin_name})"
                    )

    def get_command(self, ctx: click.Context, name: str):
        if name not in _BUILTINS:
            self._load_plugin_commands()
        command = super().get_command(ctx, name)
        if command is None and name in COMMAND_PROVIDERS:
            dist = COMMAND_PROVIDERS[name]
            _fail(DareError(f"the command {name!r} comes with {dist}, which is not installed: pip install {dist}"))
        return command

    def list_commands(self, ctx: click.Context):
        self._load_plugin_commands()
        return super().list_commands(ctx)


@click.group(cls=DareGroup)
@click.version_option(__version__, prog_name="dare")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines on stderr (warnings and errors stay).")
def cli(quiet: bool) -> None:
    """DARE: post-training and evaluation of diffusion LLMs, with plugins.

    Results (tables, --json) go to stdout; progress, logs, warnings and errors to stderr. Exit
    status: 0 done; 2 refused or stopped with one `error:` line (bad input, a diverged run);
    75 stopped by a stop signal, checkpointed (trainer.resume=auto continues); 1 an
    unexpected failure (a traceback: please report it); 130 interrupted.
    """
    if quiet:
        os.environ[QUIET_ENV] = "1"  # read by the runs (and the ranks they launch)


OVERRIDES = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")


@cli.command()
@click.option("--algo", required=True, help="Algorithm name (see `dare list algorithms`).")
@click.option("--model", required=True, help="Model family (see `dare list models`).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML run config; KEY=VALUE overrides win over it.",
)
@click.option("--overwrite", is_flag=True, help="Replace the run directory of an existing run_name.")
@OVERRIDES
def train(algo: str, model: str, config_file: Optional[str], overwrite: bool, overrides: tuple[str, ...]) -> None:
    """Train MODEL with ALGO and write a run directory.

    Example: dare train --algo ALGO --model FAMILY trainer.steps=10
    """
    from dare_core.config import resolve

    dare = _dare()
    config = resolve(dare, algo=algo, model=model, config_file=config_file, overrides=overrides)
    from dare_core.train import train as run_train  # torch: after the config is checked

    summary = run_train(dare, config, overwrite=overwrite)
    ev = summary.get("eval", {})
    parts = [f"{k}={v['accuracy']:.3f}" for k, v in ev.items() if isinstance(v, dict) and "accuracy" in v]
    if os.environ.get("RANK", "0") == "0":  # one line for a run of several processes
        click.echo(f"done: {summary['run_dir']}/summary.json" + (f" (accuracy {' '.join(parts)})" if parts else ""))


@cli.command()
@click.option("--model", required=True, help="Model family.")
@click.option("--prompt", "prompts", multiple=True, required=True, help="User message (repeatable).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None)
@OVERRIDES
def generate(model: str, prompts: tuple[str, ...], config_file: Optional[str], overrides: tuple[str, ...]) -> None:
    """Generate a response to each --prompt with the model's rollout backend (greedy unless
    rollout.temperature is set)."""
    from dare_core.config import resolve

    dare = _dare()
    overrides = ("rollout.temperature=0",) + tuple(overrides)
    config = resolve(dare, model=model, config_file=config_file, overrides=overrides, need_algo=False)
    import torch  # after the config is checked

    from dare_core.preflight import preflight
    from dare_core.workflows.batching import decode_responses, left_pad
    from dare_core.workflows.runtime import build_rollout, load_model

    preflight(dare, config, prompts=prompts)
    wrapper = load_model(dare, config, trainable=False)
    backend = build_rollout(dare, config)
    ids = [wrapper.encode(wrapper.render_prompt([{"role": "user", "content": p}])) for p in prompts]
    pid, pmask = left_pad(ids, wrapper.pad_token_id)
    out = backend.generate(
        wrapper, pid.to(wrapper.device), pmask.to(wrapper.device), generator=torch.Generator().manual_seed(config.seed)
    )
    for text in decode_responses(wrapper, out.response_ids.cpu(), out.response_mask.cpu()):
        click.echo(text)
        click.echo("---")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List plugins: name, distribution, version and implemented hooks (or why it is broken)."""
    from dare_core.listing import marked

    cli._load_plugin_commands()  # a command hook that raises breaks its plugin too
    infos = _dare().plugin_infos()
    if as_json:
        click.echo(json.dumps([i.as_dict() for i in infos], indent=2))
        return
    rows = [
        (
            marked(i.name, i.example),
            i.distribution,
            i.version,
            f"BROKEN: {i.broken}" if i.broken else ", ".join(h.replace("dare_", "") for h in i.hooks),
        )
        for i in infos
    ]
    _table(("plugin", "distribution", "version", "hooks"), rows)


LIST_KINDS = (
    "models",
    "algorithms",
    "rollouts",
    "corruptions",
    "trajectories",
    "estimators",
    "losses",
    "advantages",
    "tasks",
    "engines",
    "workflows",
)


@cli.command("list")
@click.argument("kind", required=False, type=click.Choice(LIST_KINDS))
@click.option("--matrix", is_flag=True, help="Algorithm × model-family support matrix.")
@click.option(
    "--fit",
    is_flag=True,
    help="Task × bundled checkpoint: whether each task's held-out prompts fit the model under dare eval.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(kind: Optional[str], matrix: bool, fit: bool, as_json: bool) -> None:
    """List registered components of KIND (or the support matrix, or which tasks fit which
    bundled checkpoints)."""
    from dare_core.listing import fit_matrix, list_rows, support_matrix

    dare = _dare()
    if fit:
        header, rows = fit_matrix(dare)
    elif matrix or kind is None:
        header, rows = support_matrix(dare)
    else:
        header, rows = list_rows(dare, kind)
    if as_json:
        click.echo(json.dumps([dict(zip(header, r)) for r in rows], indent=2))
    else:
        _table(header, rows)


@cli.group("config")
def config_group() -> None:
    """Inspect run configurations."""


@config_group.command("show")
@click.option("--algo", required=True)
@click.option("--model", required=True)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None)
@OVERRIDES
def config_show(algo: str, model: str, config_file: Optional[str], overrides: tuple[str, ...]) -> None:
    """Print the resolved run config with the help text of every field."""
    from dare_core.config import render_with_help, resolve

    dare = _dare()
    config = resolve(dare, algo=algo, model=model, config_file=config_file, overrides=overrides)
    click.echo(render_with_help(config, dare), nl=False)


@cli.group("plugin")
def plugin_group() -> None:
    """Create plugin distributions."""


@plugin_group.command("new")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option(
    "--dir",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to write (must not exist); default ./dare-plugin-NAME.",
)
def plugin_new(kind: str, name: str, out_dir: Optional[str]) -> None:
    """Write a new plugin distribution of KIND named NAME.

    The distribution registers NAME and holds its tests, which pass as written.

    \b
    Example: dare plugin new algorithm my_algo
             python -m pytest -q dare-plugin-my-algo/tests
    """
    from dare_core.scaffold import new_plugin

    path = new_plugin(kind, name, out_dir)
    click.echo(f"created {path}; test it: python -m pytest -q {path}/tests; install it: pip install -e '{path}[test]'")


def _table(header, rows) -> None:
    rows = [tuple(str(c) for c in r) for r in rows]
    widths = [max([len(str(h))] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(header, widths))
    click.echo(line.rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


_BUILTINS = {"train", "generate", "plugins", "list", "config", "plugin"}
#: the first-party distributions' commands: a missing one names the distribution to install
COMMAND_PROVIDERS = {
    "eval": "dare-plugin-eval",
    "compare": "dare-plugin-report",
    "plot": "dare-plugin-report",
    "bench": "dare-plugin-bench",
}


def main() -> None:  # console script
    cli(prog_name="dare")


if __name__ == "__main__":  # pragma: no cover
    main()
