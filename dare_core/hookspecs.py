"""Hook specifications of DARE.

Every hook is documented like pytest's hookspecs: what it is for, each parameter with its type,
what the return value means, and its call semantics (who calls it, when and how often, which
implementations run and in which order, what an exception does). ``docs/hooks.md`` is the same
reference with examples. Plugins implement the hooks with ``@dare_core.hookimpl`` (also
``dare_core.api.hookimpl``) in the module their ``dare`` entry point names; an implementation
takes the parameters it needs, by these names.

pluggy is used for registration and lifecycle only; no hook is a ``firstresult`` hook and no
return value is used. The training loops call the registered component objects directly, never
``pm.hook`` per micro-batch.

**Registration hooks** (``dare_register_*`` but ``dare_register_commands``) are called by
:func:`dare_core.plugins.build` after every plugin is registered and ``dare_addhooks`` ran: each
hook in the order of this file (``dare_core.plugins.REGISTRATION_HOOKS``), each hook's
implementations one after another in the order pluggy lists them (``get_hookimpls()``), which is
registration order: the core's default plugin, the ``dare`` entry points sorted by name, then the
``extra_plugins`` of the call (an implementation marked ``trylast`` is listed first, ``tryfirst``
last). Each implementation receives a ``register`` callback bound to its plugin: ``register(spec)``
records the plugin as the owner of ``spec.name`` in the hook's registry; the same object
registered again by the same plugin is ignored, a name another plugin registered raises
:class:`~dare_core.errors.DuplicateNameError` (naming both plugins) and a spec without a ``name``
raises ``TypeError``. A ``DuplicateNameError`` stops the build. Any other exception raised by an
implementation marks its plugin *broken*: it is unregistered, everything it registered in any
registry is dropped and the reason is kept in its ``PluginInfo.broken`` (``build(strict=True)``,
and :func:`~dare_core.plugins.get_dare` under ``DARE_DEBUG=1``, re-raise it instead).
:func:`~dare_core.plugins.get_dare` builds once per process, so these hooks run once per process
(each further ``build()``, e.g. in tests, calls them again on fresh registries).

**Lifecycle hooks** are called through ``pm.hook`` in pluggy's order: last registered plugin
first (``tryfirst`` / ``trylast`` and wrappers as pluggy defines them). Every implementation is
called; an exception stops the call (the remaining implementations are not called) and
propagates to the caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    import click

    from dare_core.config import RunConfig
    from dare_core.interfaces import (
        AlgorithmSpec,
        ComponentSpec,
        ConfigSection,
        EngineSpec,
        ModelFamily,
        RolloutSpec,
        TaskSpec,
        WorkflowSpec,
    )

hookspec = pluggy.HookspecMarker("dare")

#: ``register(family)`` of :func:`dare_register_model_wrappers`
RegisterFamily = Callable[["ModelFamily"], None]
#: ``register(spec)`` of the five component hooks (corruptions, trajectory builders, likelihood
#: estimators, policy losses, advantage estimators)
RegisterComponent = Callable[["ComponentSpec"], None]
#: ``register(spec)`` of :func:`dare_register_rollout_backends`
RegisterRollout = Callable[["RolloutSpec"], None]
#: ``register(spec)`` of :func:`dare_register_algorithms`
RegisterAlgorithm = Callable[["AlgorithmSpec"], None]
#: ``register(spec)`` of :func:`dare_register_tasks`
RegisterTask = Callable[["TaskSpec"], None]
#: ``register(section)`` of :func:`dare_register_config_sections`
RegisterConfigSection = Callable[["ConfigSection"], None]
#: ``register(spec)`` of :func:`dare_register_engines`
RegisterEngine = Callable[["EngineSpec"], None]
#: ``register(spec)`` of :func:`dare_register_workflows`
RegisterWorkflow = Callable[["WorkflowSpec"], None]


# ----------------------------------------------------------------------------- registration
@hookspec
def dare_register_model_wrappers(register: RegisterFamily) -> None:
    """Register model families: how a checkpoint loads into a
    :class:`~dare_core.interfaces.ModelWrapper`, its diffusion kind, capabilities, default rollout
    backend and bundled checkpoint.

    :param register: ``register(family: ModelFamily) -> None``; call it once per family.
        ``family.name`` is the ``--model`` / ``model.family`` name (registry ``models``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), the first registration
    hook. Every implementation is called, in registration order; an exception other than
    ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_corruptions(register: RegisterComponent) -> None:
    """Register forward corruption processes.

    :param register: ``register(spec: ComponentSpec) -> None``; call it once per corruption.
        ``spec.factory(**options)`` builds a :class:`~dare_core.interfaces.ForwardCorruption`;
        ``spec.name`` is the name of role ``corruption`` in ``AlgorithmSpec.components``
        (registry ``corruptions``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_model_wrappers``. Every implementation is called, in registration order; an
    exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_trajectory_builders(register: RegisterComponent) -> None:
    """Register trajectory builders: what a rollout records and how it becomes training rows.

    :param register: ``register(spec: ComponentSpec) -> None``; call it once per builder.
        ``spec.factory(**options)`` builds a :class:`~dare_core.interfaces.TrajectoryBuilder`;
        ``spec.name`` is the name of role ``trajectory`` (registry ``trajectories``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_corruptions``. Every implementation is called, in registration order; an
    exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_likelihood_estimators(register: RegisterComponent) -> None:
    """Register likelihood estimators: log-likelihood surrogates of a response, per token or per
    sequence.

    :param register: ``register(spec: ComponentSpec) -> None``; call it once per estimator.
        ``spec.factory(**options)`` builds a :class:`~dare_core.interfaces.LikelihoodEstimator`;
        ``spec.name`` is the name of role ``estimator`` (registry ``estimators``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_trajectory_builders``. Every implementation is called, in registration order;
    an exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_policy_losses(register: RegisterComponent) -> None:
    """Register losses returning ``(loss, metrics)``, one seam per workflow.

    :param register: ``register(spec: ComponentSpec) -> None``; call it once per loss.
        ``spec.factory(**options)`` builds the loss of an algorithm's workflow: a
        :class:`~dare_core.interfaces.PolicyLoss` (``rl``; it may also be an
        :class:`~dare_core.interfaces.AccumulatingLoss`), an
        :class:`~dare_core.interfaces.SFTObjective` (``sft``) or a
        :class:`~dare_core.interfaces.PreferenceLoss` (``preference``); ``spec.name`` is the name
        of role ``loss`` (registry ``losses``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_likelihood_estimators``. Every implementation is called, in registration
    order; an exception other than ``DuplicateNameError`` marks the plugin broken (module
    docstring)."""


@hookspec
def dare_register_advantage_estimators(register: RegisterComponent) -> None:
    """Register advantage estimators: rewards of a batch's rollouts to their advantages.

    :param register: ``register(spec: ComponentSpec) -> None``; call it once per estimator.
        ``spec.factory(**options)`` builds an :class:`~dare_core.interfaces.AdvantageEstimator`;
        ``spec.name`` is the name of role ``advantage`` (registry ``advantages``);
        ``spec.needs_groups`` makes ``trainer.group_size=1`` an error.
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_policy_losses``. Every implementation is called, in registration order; an
    exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_rollout_backends(register: RegisterRollout) -> None:
    """Register rollout backends: the config class of their ``rollout:`` section, the wrapper
    kinds they drive, what they can record, the optional methods they offer, how they are synced.

    :param register: ``register(spec: RolloutSpec) -> None``; call it once per backend.
        ``spec.build(rollout_config)`` builds a :class:`~dare_core.interfaces.RolloutBackend`;
        ``spec.name`` is the ``rollout.backend`` value (registry ``rollouts``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_advantage_estimators``. Every implementation is called, in registration
    order; an exception other than ``DuplicateNameError`` marks the plugin broken (module
    docstring)."""


@hookspec
def dare_register_algorithms(register: RegisterAlgorithm) -> None:
    """Register algorithms: config class, workflow, the components they compose, what their
    training rollout needs, required capabilities and kinds, recipe defaults.

    :param register: ``register(spec: AlgorithmSpec) -> None``; call it once per algorithm.
        ``spec.build(algorithm_config, lookup)`` returns the run's components, the bundle its
        workflow names (:attr:`~dare_core.interfaces.WorkflowSpec.components`, e.g.
        :class:`~dare_core.interfaces.RLComponents`); ``spec.name`` is the ``--algo`` name
        (registry ``algorithms``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_rollout_backends``. Every implementation is called, in registration order; an
    exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_tasks(register: RegisterTask) -> None:
    """Register tasks: datasets with their reward rules.

    :param register: ``register(spec: TaskSpec) -> None``; call it once per task.
        ``spec.build(task_config)`` builds a :class:`~dare_core.interfaces.Task`; ``spec.name``
        is the ``task.name`` value (registry ``tasks``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_algorithms``. Every implementation is called, in registration order; an
    exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_config_sections(register: RegisterConfigSection) -> None:
    """Register top-level run-config sections a plugin owns (e.g. ``tracking:``), set in every
    config layer and read with ``config.plugin_section(name)``.

    :param register: ``register(section: ConfigSection) -> None``; call it once per section.
        ``section.name`` is the top-level key (registry ``config_sections``); resolving a config
        refuses a name that is a key of the core's ``RunConfig`` and a ``config_cls`` that is
        not an attrs class.
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_tasks``. Every implementation is called, in registration order; an exception
    other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_engines(register: RegisterEngine) -> None:
    """Register execution engines: how a run's steps execute (processes, placement, precision,
    optimizer, collectives, checkpoint state).

    :param register: ``register(spec: EngineSpec) -> None``; call it once per engine.
        ``spec.build(run_config)`` builds an :class:`~dare_core.interfaces.Engine`; ``spec.name``
        is the ``engine.name`` value (registry ``engines``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), after
    ``dare_register_config_sections``. Every implementation is called, in registration order; an
    exception other than ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_workflows(register: RegisterWorkflow) -> None:
    """Register training workflows, the loops an algorithm's ``AlgorithmSpec.workflow`` names.

    :param register: ``register(spec: WorkflowSpec) -> None``; call it once per workflow.
        ``spec.run(ctx)`` runs a whole training run and returns its summary; ``spec.name`` is
        the workflow name (registry ``workflows``).
    :return: nothing; the return value is ignored.

    Called once per :func:`~dare_core.plugins.build` (once per process), the last registration
    hook. Every implementation is called, in registration order; an exception other than
    ``DuplicateNameError`` marks the plugin broken (module docstring)."""


@hookspec
def dare_register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``dare`` command line.

    :param cli: the root ``click.Group``; call ``cli.add_command(cmd)`` or use ``@cli.command()``.
    :return: nothing; the return value is ignored.

    Called by the CLI once per process, the first time it needs a command that is not built in or
    lists the commands (``dare --help``), after the built-in commands exist; never by
    :func:`~dare_core.plugins.build`. Every implementation is called, one after another in
    registration order (as the registration hooks). A command name that a built-in or an earlier
    plugin already uses is a one-line error (the existing command is kept). An implementation
    that raises has its added commands removed and its plugin marked broken (with
    ``DARE_DEBUG=1`` the exception propagates)."""


# ----------------------------------------------------------------------------- lifecycle
@hookspec(historic=True)
def dare_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add new hook specifications (for plugins that define hooks of their own).

    :param pluginmanager: the DARE plugin manager; call ``pluginmanager.add_hookspecs(module)``.
    :return: nothing; the return value is ignored.

    Historic: called once by :func:`~dare_core.plugins.build` with ``call_historic``, after every
    plugin is registered and before the registration hooks; a plugin registered on the manager
    afterwards is called when it is registered. Every implementation is called, in pluggy's
    order; an exception propagates out of ``build()``."""


@hookspec(historic=True)
def dare_configure(config: RunConfig) -> None:
    """A run has been configured; the resolved run config is final (set up loggers or observers,
    check the plugin's settings).

    :param config: the frozen :class:`dare_core.config.RunConfig` of the run.
    :return: nothing; the return value is ignored.

    Historic: called by :func:`dare_core.train.train` with ``call_historic``, once per run on
    every process, after the algorithm and its workflow are looked up and before the engine is
    built, the pre-flight checks run and the run directory is created; a plugin registered
    later is called, when it is registered, with the config of every run configured so far in
    the process. Every implementation is called, in pluggy's order. An exception propagates out
    of ``train()``: the run stops before any work, with no run directory and no
    ``dare_unconfigure``."""


@hookspec
def dare_on_run_start(config: RunConfig, run_dir: str) -> None:
    """A training run starts: its run directory exists and holds the resolved ``config.yaml``.

    :param config: the run config passed to ``dare_configure``.
    :param run_dir: the path of the run directory.
    :return: nothing; the return value is ignored.

    Called once per run by :func:`dare_core.train.train`, on the main process only, after the
    engine, the model and the run directory's files are set up and before the workflow runs (its
    evaluation before training and its first step). Open per-run outputs here and close them in
    ``dare_unconfigure``, which follows also when the run fails. Every implementation is called,
    in pluggy's order; an exception stops the run (``dare_unconfigure`` is still called)."""


@hookspec
def dare_on_step_end(step: int, metrics: dict[str, Any]) -> None:
    """A training step finished.

    :param step: the 1-based training-step index of the run (RL: one rollout batch; SFT and
        preference: one optimizer step).
    :param metrics: the step's record as written to ``metrics.jsonl``: scalar metrics keyed by
        name (``step``, ``loss``, ``grad_norm``, ``lr``, ...), numbers averaged over ranks, a
        non-finite value as ``None`` with its key listed under ``nonfinite``.
    :return: nothing; the return value is ignored.

    Called by the workflows' tracker after every step, on every process, after the record is
    reduced over ranks and (on the main process) its line is written to ``metrics.jsonl``, before
    the step's console line, divergence check, evaluation and checkpoint. Every implementation is
    called, in pluggy's order; an exception stops the run. Implementations must be cheap or
    asynchronous."""


@hookspec
def dare_on_eval(step: int, label: str, metrics: dict[str, Any]) -> None:
    """A held-out evaluation of a training run finished.

    :param step: the step it belongs to: 0 before training, ``N`` for the evaluation every
        ``eval.every`` steps, ``trainer.steps`` after training.
    :param label: ``before``, ``step-N`` or ``after``.
    :param metrics: its results as written to the eval line of ``metrics.jsonl`` (``accuracy``,
        ``reward``, ``n``, ``nfe``, ``seconds``, and ``vs_before`` when compared with ``before``;
        a non-finite value as ``None`` with its key listed under ``nonfinite``).
    :return: nothing; the return value is ignored.

    Called by the workflows' tracker on the main process only, after every held-out evaluation of
    a training run and after its line is written to ``metrics.jsonl`` (at step ``N``: after
    ``dare_on_step_end`` of step ``N``). Every implementation is called, in pluggy's order; an
    exception stops the run."""


@hookspec
def dare_unconfigure(config: RunConfig) -> None:
    """The run ended (normally or with an error); release what ``dare_configure`` set up.

    :param config: the run config passed to ``dare_configure``.
    :return: nothing; the return value is ignored.

    Called once per run by :func:`dare_core.train.train` on every process, in a ``finally`` block
    after ``dare_configure`` returned: also when the engine, the pre-flight checks, the set-up or
    the workflow raised. Every implementation is called, in pluggy's order; an exception
    propagates out of ``train()`` (chained to the run's own error, if any)."""
