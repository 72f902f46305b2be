"""Hook specifications of DARE.

Every hook is documented like pytest's: what it is for, its parameters, when it is called and how
the results of several plugins combine (every page of it: ``docs/hooks.md``). Plugins implement
them with ``@dare_core.hookimpl`` in the module their ``dare`` entry point names.

pluggy is used for registration and lifecycle only. The registration hooks (``dare_register_*``
but commands) are called once per process by :func:`dare_core.plugins.build`, each plugin's in
registration order. ``register(spec)`` records the calling plugin as the owner and refuses a name
another plugin already registered; a plugin whose hook raises is skipped as broken, with what it
registered. Every implementation of a hook is called and return values are ignored. The training
loop calls the registered component objects directly, never ``pm.hook`` per micro-batch.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("dare")

Register = Callable[[Any], None]


# ----------------------------------------------------------------------------- registration
@hookspec
def dare_register_model_wrappers(register: Register) -> None:
    """Register model families.

    :param register: call ``register(ModelFamily(...))`` once per family; called once per process."""


@hookspec
def dare_register_corruptions(register: Register) -> None:
    """Register forward corruptions (factories of :class:`~dare_core.interfaces.ForwardCorruption`).

    :param register: call ``register(ComponentSpec(...))`` once per corruption; called once per process."""


@hookspec
def dare_register_trajectory_builders(register: Register) -> None:
    """Register trajectory builders (factories of :class:`~dare_core.interfaces.TrajectoryBuilder`).

    :param register: call ``register(ComponentSpec(...))`` once per builder; called once per process."""


@hookspec
def dare_register_likelihood_estimators(register: Register) -> None:
    """Register likelihood estimators (factories of :class:`~dare_core.interfaces.LikelihoodEstimator`).

    :param register: call ``register(ComponentSpec(...))`` once per estimator; called once per process."""


@hookspec
def dare_register_policy_losses(register: Register) -> None:
    """Register losses returning ``(loss, metrics)`` (factories of :class:`~dare_core.interfaces.PolicyLoss`).

    :param register: call ``register(ComponentSpec(...))`` once per loss; called once per process."""


@hookspec
def dare_register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators (factories of :class:`~dare_core.interfaces.AdvantageEstimator`).

    :param register: call ``register(ComponentSpec(...))`` once per estimator; called once per process."""


@hookspec
def dare_register_rollout_backends(register: Register) -> None:
    """Register rollout backends: config class, the wrapper kinds they drive, what they record.

    :param register: call ``register(RolloutSpec(...))`` once per backend; called once per process."""


@hookspec
def dare_register_algorithms(register: Register) -> None:
    """Register algorithms: config class, workflow, the components they compose, requirements.

    :param register: call ``register(AlgorithmSpec(...))`` once per algorithm; called once per process."""


@hookspec
def dare_register_tasks(register: Register) -> None:
    """Register tasks: datasets with reward rules.

    :param register: call ``register(TaskSpec(...))`` once per task; called once per process."""


@hookspec
def dare_register_config_sections(register: Register) -> None:
    """Register top-level run-config sections a plugin owns (e.g. ``tracking:``), set in every
    config layer and read with ``config.plugin_section(name)``; a key of the core's config is refused.

    :param register: call ``register(ConfigSection(...))`` once per section; called once per process."""


@hookspec
def dare_register_engines(register: Register) -> None:
    """Register execution engines (how a run's steps execute), selected by ``engine.name``.

    :param register: call ``register(EngineSpec(...))`` once per engine; called once per process."""


@hookspec
def dare_register_workflows(register: Register) -> None:
    """Register training workflows, the loops an algorithm's ``workflow`` names.

    :param register: call ``register(WorkflowSpec(...))`` once per workflow; called once per process."""


@hookspec
def dare_register_commands(cli: Any) -> None:
    """Add subcommands to the ``dare`` command line.

    :param cli: the root ``click.Group``; call ``cli.add_command(cmd)`` or use ``@cli.command()``.

    Called once when the CLI starts, after the built-in commands exist, in registration order. A
    name clash with an existing command is an error; a hook that raises marks its plugin broken."""


# ----------------------------------------------------------------------------- lifecycle
@hookspec(historic=True)
def dare_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add new hook specifications (for plugins that define hooks of their own).

    :param pluginmanager: the DARE plugin manager; call ``pluginmanager.add_hookspecs(module)``.

    Historic: called for every plugin, also for plugins registered later."""


@hookspec(historic=True)
def dare_configure(config: Any) -> None:
    """A run has been configured; the resolved run config is final (set up loggers or observers).

    :param config: the frozen :class:`dare_core.config.RunConfig`.

    Historic: called once per run for every plugin, also for plugins registered after the run started."""


@hookspec
def dare_on_step_end(step: int, metrics: dict[str, float]) -> None:
    """A training step finished.

    :param step: the 1-based optimizer-step index of the run.
    :param metrics: scalar metrics of the step (already reduced over ranks), keyed by name.

    Called on the main process after every step, after the metrics line is written to
    ``metrics.jsonl``. Implementations must be cheap or asynchronous."""


@hookspec
def dare_on_run_start(config: Any, run_dir: str) -> None:
    """A training run starts: its run directory exists and holds the resolved ``config.yaml``.

    :param config: the run config passed to ``dare_configure``.
    :param run_dir: the path of the run directory.

    Called once per run by :func:`dare_core.train.train` on the main process, after the model is
    loaded and the run directory's files are written, before the first evaluation and step. Open
    per-run outputs here and close them in ``dare_unconfigure`` (called also when the run fails)."""


@hookspec
def dare_on_eval(step: int, label: str, metrics: dict[str, Any]) -> None:
    """A held-out evaluation of a training run finished.

    :param step: the optimizer step it belongs to: 0 before training, ``N`` for the evaluation
        every ``eval.every`` steps, ``trainer.steps`` after training.
    :param label: ``before``, ``step-N`` or ``after``.
    :param metrics: its results as written to the eval line of ``metrics.jsonl`` (``accuracy``,
        ``reward``, ``n``, ``nfe``, ``seconds``, and ``vs_before`` when compared with ``before``).

    Called on the main process after every held-out evaluation of a training workflow, after its
    line is written to ``metrics.jsonl`` (at step ``N``: after ``dare_on_step_end`` of step ``N``)."""


@hookspec
def dare_unconfigure(config: Any) -> None:
    """The run ended (normally or with an error); release what ``dare_configure`` set up.

    :param config: the run config passed to ``dare_configure``; called once per run."""
