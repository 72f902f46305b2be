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
def dare_unconfigure(config: Any) -> None:
    """The run ended (normally or with an error); release what ``dare_configure`` set up.

    :param config: the run config passed to ``dare_configure``.

    Called once per run; all implementations are called; return values are ignored.
    """
