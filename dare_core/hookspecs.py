"""Hook specifications of DARE.

Every hook is documented like pytest's: what it is for, its parameters, what it returns, when it
is called and how the results of several plugins combine. Plugins implement them with
``@dare_core.hookimpl``; the package named in a plugin's ``dare`` entry point is the module that
holds those functions.

pluggy is used for registration and lifecycle only. The registration hooks run once per process
(from :func:`dare_core.plugins.build`, which :func:`dare_core.plugins.get_dare` calls once); the training loop afterwards calls the
registered component objects directly, never ``pm.hook`` per micro-batch.
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

    :param register: call ``register(ModelFamily(...))`` once per family. The core records the
        calling plugin as the owner and refuses a name another plugin already registered.

    Called once per process when the plugin manager is built. All implementations are called;
    return values are ignored.
    """


@hookspec
def dare_register_corruptions(register: Register) -> None:
    """Register forward corruption processes (``ComponentSpec`` whose factory builds a
    :class:`~dare_core.interfaces.ForwardCorruption`).

    :param register: call ``register(ComponentSpec(...))`` once per process.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_trajectory_builders(register: Register) -> None:
    """Register trajectory builders (``ComponentSpec`` whose factory builds a
    :class:`~dare_core.interfaces.TrajectoryBuilder`): what a rollout must record and how it
    becomes training input.

    :param register: call ``register(ComponentSpec(...))`` once per builder.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_likelihood_estimators(register: Register) -> None:
    """Register likelihood estimators (``ComponentSpec`` whose factory builds a
    :class:`~dare_core.interfaces.LikelihoodEstimator`): per-token or per-sequence
    log-likelihood surrogates with an explicit normaliser.

    :param register: call ``register(ComponentSpec(...))`` once per estimator.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_policy_losses(register: Register) -> None:
    """Register losses returning ``(loss, metrics)`` (``ComponentSpec`` whose factory builds a
    :class:`~dare_core.interfaces.PolicyLoss`), documented with equation, reference and shapes.

    :param register: call ``register(ComponentSpec(...))`` once per loss.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators (``ComponentSpec`` whose factory builds a
    :class:`~dare_core.interfaces.AdvantageEstimator`), ``(rewards, group_ids) -> advantages``.

    :param register: call ``register(ComponentSpec(...))`` once per estimator.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_rollout_backends(register: Register) -> None:
    """Register rollout backends (:class:`~dare_core.interfaces.RolloutSpec`): generation
    engines with their config class, the wrapper kinds they drive and what they can record.

    :param register: call ``register(RolloutSpec(...))`` once per backend.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_algorithms(register: Register) -> None:
    """Register algorithms (:class:`~dare_core.interfaces.AlgorithmSpec`): id, config class,
    workflow kind, the components it composes, required capabilities and paper reference.

    :param register: call ``register(AlgorithmSpec(...))`` once per algorithm.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_tasks(register: Register) -> None:
    """Register tasks (:class:`~dare_core.interfaces.TaskSpec`): datasets with reward rules.

    :param register: call ``register(TaskSpec(...))`` once per task.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_config_sections(register: Register) -> None:
    """Register top-level sections of the run config that a plugin owns
    (:class:`~dare_core.interfaces.ConfigSection`), e.g. an observer's ``tracking:`` section.

    :param register: call ``register(ConfigSection(...))`` once per section.

    Called once per process; all implementations are called; return values are ignored. The
    section's key is then accepted in config files and overrides (``<name>.<field>=value``),
    structured with its config class together with the core's sections (every problem reported
    in one error), written to the run's ``config.yaml`` and read with
    ``config.plugin_section(name)``. A name that is a key of the core's run config is refused
    when a config is resolved.
    """


@hookspec
def dare_register_engines(register: Register) -> None:
    """Register execution engines (:class:`~dare_core.interfaces.EngineSpec`): how a run's steps
    execute — processes, placement and sharding, precision, optimizer, gradient reductions and
    checkpoint state. ``engine.name`` selects one; the core registers ``single``.

    :param register: call ``register(EngineSpec(...))`` once per engine.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_workflows(register: Register) -> None:
    """Register training workflows (:class:`~dare_core.interfaces.WorkflowSpec`): the loop an
    algorithm's ``workflow`` names (the core registers ``rl`` and ``sft``).

    :param register: call ``register(WorkflowSpec(...))`` once per workflow.

    Called once per process; all implementations are called; return values are ignored.
    """


@hookspec
def dare_register_commands(cli: Any) -> None:
    """Add subcommands to the ``dare`` command line.

    :param cli: the root ``click.Group``; call ``cli.add_command(cmd)`` or use ``@cli.command()``.

    Called once when the CLI starts, after the built-in commands exist. All implementations are
    called; return values are ignored. A name clash with an existing command is an error.
    """


# ----------------------------------------------------------------------------- lifecycle
@hookspec(historic=True)
def dare_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add new hook specifications (for plugins that define hooks of their own).

    :param pluginmanager: the DARE plugin manager; call ``pluginmanager.add_hookspecs(module)``.

    Historic: called for every plugin, also for plugins registered later. Return values are
    ignored.
    """


@hookspec(historic=True)
def dare_configure(config: Any) -> None:
    """A run has been configured; the resolved run config is final.

    :param config: the frozen :class:`dare_core.config.RunConfig`.

    Historic: called once per run for every plugin, also for plugins registered after the
    run started. Return values are ignored. Use it to set up loggers or observers.
    """


@hookspec
def dare_on_step_end(step: int, metrics: dict[str, float]) -> None:
    """A training step finished.

    :param step: the 1-based optimizer-step index of the run.
    :param metrics: scalar metrics of the step (already reduced over ranks), keyed by name.

    Called on the main process after every step, after the metrics line is written to
    ``metrics.jsonl``. All implementations are called (observers: loggers, plots); return
    values are ignored. Implementations must be cheap or asynchronous.
    """


@hookspec
def dare_on_run_start(config: Any, run_dir: str) -> None:
    """A training run starts: its run directory exists and holds the resolved ``config.yaml``.

    :param config: the run config passed to ``dare_configure``.
    :param run_dir: the path of the run directory.

    Called once per run by :func:`dare_core.train.train` on the main process, after the model is
    loaded and the run directory's files are written, before the first evaluation and the first
    step. All implementations are called; return values are ignored. Open per-run outputs
    (writers, files under ``run_dir``) here and close them in ``dare_unconfigure``, which is
    called also when the run fails.
    """


@hookspec
def dare_on_eval(step: int, label: str, metrics: dict[str, Any]) -> None:
    """A held-out evaluation of a training run finished.

    :param step: the optimizer step it belongs to: 0 before training, ``N`` for the evaluation
        every ``eval.every`` steps, ``trainer.steps`` after training.
    :param label: ``before``, ``step-N`` or ``after``.
    :param metrics: its results as written to the eval line of ``metrics.jsonl``: ``accuracy``,
        ``reward``, ``n``, ``nfe``, ``seconds`` and, when compared with the evaluation before
        training, ``vs_before`` (a dict of scalars: ``gained``, ``lost``, ``delta``, ``se``,
        ``p_value``).

    Called on the main process after every held-out evaluation of the RL, SFT and preference
    workflows, after its line is written to ``metrics.jsonl`` (an evaluation at step ``N``
    comes after ``dare_on_step_end`` of step ``N``). All implementations are called; return
    values are ignored.
    """


@hookspec
def dare_unconfigure(config: Any) -> None:
    """The run ended (normally or with an error); release what ``dare_configure`` set up.

    :param config: the run config passed to ``dare_configure``.

    Called once per run; all implementations are called; return values are ignored.
    """
