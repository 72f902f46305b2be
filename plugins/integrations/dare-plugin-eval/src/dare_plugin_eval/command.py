"""The ``dare eval`` command. The suite (and with it torch) is imported inside the callback, so
``dare --help`` stays fast."""

from __future__ import annotations

import json
import os
from typing import Optional

import click


@click.command("eval")
@click.option("--model", required=True, help="Model family (see `dare list models`).")
@click.option(
    "--tasks",
    default=None,
    metavar="T1,T2,...",
    help="Tasks to evaluate, comma-separated (see `dare list tasks`); replaces task.name. Default: task.name.",
)
@click.option(
    "--samples",
    default=1,
    show_default=True,
    type=int,
    help="Generations per prompt; more than 1 needs eval.temperature > 0.",
)
@click.option(
    "--k",
    "ks",
    default=None,
    metavar="K1,K2,...",
    help="The k of pass@k and maj@k, comma-separated, each at most --samples. Default: 1 and --samples.",
)
@click.option(
    "--mc-samples",
    default=32,
    show_default=True,
    type=int,
    help="Multiple-choice tasks (choices in the items, e.g. multiple_choice): Monte-Carlo "
    "samples of each choice's likelihood (ELBO); such tasks are scored by likelihood.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML run config; KEY=VALUE overrides win over it.",
)
@click.option("--overwrite", is_flag=True, help="Replace the eval directory of an existing run_name.")
@click.option("--json", "as_json", is_flag=True, help="Print the results (results.json) as one JSON line.")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def eval_cmd(
    model: str,
    tasks: Optional[str],
    samples: int,
    ks: Optional[str],
    mc_samples: int,
    config_file: Optional[str],
    overwrite: bool,
    as_json: bool,
    overrides: tuple[str, ...],
) -> None:
    """Evaluate a checkpoint (model.path=DIR or model.lora.adapter=DIR) on held-out tasks.

    Loads the model once, answers each task's task.num_eval prompts --samples times with the
    evaluation sampler (eval.*), scores them with the task and writes an eval directory
    (<output_dir>/eval-<model>-<time>, or run_name) holding results.json, samples.jsonl and
    config.yaml; prints one row per task (accuracy, reward, pass@k, maj@k, failure kinds).

    \b
    Example:
      dare eval --model llada --tasks sudoku,countdown --samples 8 --k 1,8 \\
          eval.temperature=1.0 task.num_eval=50
    """
    from dare_core.api import get_dare
    from dare_plugin_eval.suite import parse_ks, parse_tasks, run_suite, table

    names = parse_tasks(tasks)
    results = run_suite(
        get_dare(),
        model,
        names,
        samples=samples,
        ks=parse_ks(ks, samples),
        config_file=config_file,
        overrides=overrides,
        overwrite=overwrite,
        mc_samples=mc_samples,
    )
    if os.environ.get("RANK", "0") != "0":  # one output for a run of several processes
        return
    if as_json:
        click.echo(json.dumps(results))
        return
    for line in table(results):
        click.echo(line)
    click.echo(f"wrote {results['eval_dir']}")
