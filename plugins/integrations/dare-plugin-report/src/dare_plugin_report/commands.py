"""The report commands: ``dare compare`` (paired comparison of checkpoints) and ``dare plot``
(learning curves of run directories). Core modules are imported inside the commands, so
``dare --help`` stays fast."""

from __future__ import annotations

from typing import Optional

import click


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--metric",
    "-m",
    "metrics",
    multiple=True,
    help="Metric to draw (repeatable; one panel each). Training fields as logged "
    "(reward, loss, grad_norm, ...), evaluation fields as eval.<field> "
    "(eval.accuracy). Default: each run's main metric (reward for RL, loss for SFT and "
    "preference) and eval.accuracy.",
)
@click.option(
    "--out",
    "-o",
    default="curves.png",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="PNG file to write (atomically).",
)
@click.option(
    "--smooth",
    default=1,
    show_default=True,
    type=int,
    help="Trailing moving average over this many steps for training metrics.",
)
@click.option("--label", "labels", multiple=True, help="Legend label per run (default: algo / model).")
@click.option("--title", default=None, help="Figure title.")
def plot(
    run_dirs: tuple[str, ...],
    metrics: tuple[str, ...],
    out: str,
    smooth: int,
    labels: tuple[str, ...],
    title: Optional[str],
) -> None:
    """Draw learning curves of training run directories, and the accuracy per task of evaluation
    directories (dare eval), into a PNG (needs matplotlib)."""
    from dare_plugin_report.plot import plot_runs

    written = plot_runs(run_dirs, metrics, out, smooth=smooth, labels=labels or None, title=title)
    click.echo(f"wrote {written}")


@click.command("compare")
@click.option("--model", required=True, help="Model family (see `dare list models`).")
@click.option(
    "--a",
    "a",
    required=True,
    metavar="DIR",
    help="Checkpoint A: a directory, or 'bundled' (the family's bundled checkpoint).",
)
@click.option(
    "--b",
    "bs",
    required=True,
    multiple=True,
    metavar="DIR",
    help="Checkpoint B (a directory or 'bundled'); repeat to compare several with A, which is evaluated once.",
)
@click.option(
    "--samples",
    default=8,
    show_default=True,
    type=int,
    help="Samples per prompt; sample i of every checkpoint uses the same sampling noise.",
)
@click.option(
    "--pool",
    is_flag=True,
    help="With several --b, also compare A with their mean (e.g. one recipe's seeds), prompt-clustered.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Run config to evaluate with (e.g. a run's config.yaml); KEY=VALUE overrides win over it.",
)
@click.option(
    "--training-sampler",
    is_flag=True,
    help="Judge with the sampler the run trains with, as its algorithm adjusts it (e.g. "
    "JustGRPO: one token per step, left to right, at its temperature); replaces "
    "eval.backend, eval.steps and eval.temperature; needs the run's --config.",
)
@click.option(
    "--cache",
    default=None,
    metavar="DIR",
    help="Directory keeping each evaluation's per-sample results; a repeated evaluation "
    "(same checkpoint files, sampler, task, seed and --samples) is read back.",
)
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def compare(
    model: str,
    a: str,
    bs: tuple[str, ...],
    samples: int,
    pool: bool,
    config_file: Optional[str],
    training_sampler: bool,
    cache: Optional[str],
    overrides: tuple[str, ...],
) -> None:
    """Compare checkpoint B with A, paired on the same held-out prompts.

    Both answer the task.num_eval held-out prompts, each --samples times, with the evaluation
    sampler (eval.*) and common random numbers, so the comparison is paired per sample. Prints
    both accuracies, the samples B gains and loses (McNemar's exact p), the prompts B solves more
    / less often (sign test) and the prompt-clustered difference, then the same as one JSON line.
    'bundled' keeps the model.path of --config where it has one, else it is the family's
    bundled checkpoint.

    \b
    Example (a run against the checkpoint it started from):
      dare compare --model llada --a bundled --b runs/RUN/final \\
          --config runs/RUN/config.yaml --samples 4 eval.temperature=1.0
    """
    from dare_core.api import get_dare
    from dare_plugin_report.compare import compare_checkpoints

    compare_checkpoints(
        get_dare(),
        model,
        a,
        bs,
        samples=samples,
        config_file=config_file,
        pool=pool,
        cache=cache,
        training_sampler=training_sampler,
        overrides=overrides,
    )
