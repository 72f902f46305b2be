"""A run's runtime: device, seeds, the model (with LoRA), the rollout backends of training and
evaluation, and the :class:`Context` every workflow receives from :func:`setup`."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Optional, TypeVar, cast

import attrs
import numpy as np
import torch

from dare_core._version import __version__
from dare_core.components import ComponentLookup
from dare_core.config import RunConfig, to_dict
from dare_core.console import info
from dare_core.engines import build_engine
from dare_core.engines.common import resolve_device
from dare_core.errors import DareError
from dare_core.ops.paths import configure_training_paths
from dare_core.preflight import preflight
from dare_core.rundir import RunDir

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from dare_core.interfaces import AlgorithmSpec, Components, Engine, ModelFamily, ModelWrapper, RolloutBackend, Task
    from dare_core.plugins import Dare

C = TypeVar("C", bound="Components")

#: ``model.dtype`` values; ``auto`` is resolved to the checkpoint's by config resolution (a config
#: built without one, e.g. ``RunConfig()``, keeps float32)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.float32}


def derive_seed(seed: int, *key: int) -> int:
    """A 63-bit seed for the stream ``key`` of run seed ``seed`` (``key=()`` is ``seed``)."""
    out = seed
    for k in key:
        out = (out * 6364136223846793005 + 1442695040888963407 + int(k)) % (2**63)
    return out


def seed_everything(seed: int, rank: int = 0) -> torch.Generator:
    """Seed python, numpy and torch with this rank's stream of the run seed (rank 0: the seed)."""
    seed = derive_seed(seed, rank) if rank else seed
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))  # numpy comes with transformers
    return torch.Generator().manual_seed(seed)


def load_model(dare: Dare, config: RunConfig, *, trainable: bool = True, device: Any = None):
    """Load the family's checkpoint; with ``model.lora`` (or a LoRA checkpoint as
    ``model.path``) wrap it in PEFT adapters (trainable adapters when ``trainable``)."""
    from dare_core.models import lora

    family = dare.registries.models.get(config.model.family)
    device = str(device) if device is not None else resolve_device(config.model.device)
    base_path, saved_adapter = lora.resolve_checkpoint(config.model.path)
    wrapper = family.load(
        base_path,
        dtype=DTYPES[config.model.dtype],
        device=device,
        attn_implementation=config.model.attn_implementation,
    )
    if config.model.gradient_checkpointing:  # a transformers model (the families load HF checkpoints)
        cast("PreTrainedModel", wrapper.module).gradient_checkpointing_enable()
    lcfg = config.model.lora
    if lcfg.enabled or saved_adapter is not None:
        lora.apply_lora(
            wrapper,
            lcfg,
            base_path=base_path,
            adapter=lcfg.adapter or saved_adapter,
            trainable=trainable,
            checkpointing=config.model.gradient_checkpointing,
        )
    return wrapper


def build_rollout(dare: Dare, config: RunConfig, rollout_cfg: Any = None) -> RolloutBackend:
    """The run's rollout backend on ``rollout_cfg`` (default: the training rollout config,
    ``RunConfig.train_rollout``, as config resolution derived it)."""
    spec = dare.registries.rollouts.get(config.rollout_backend)
    return spec.build(rollout_cfg if rollout_cfg is not None else config.train_rollout)


def eval_backend_name(config: RunConfig) -> str:
    """The rollout backend of evaluation: ``eval.backend``, else the training one."""
    return config.eval.backend or config.rollout_backend


def build_eval_rollout(dare: Dare, config: RunConfig) -> RolloutBackend:
    """The evaluation rollout backend on ``RunConfig.eval_rollout``."""
    return dare.registries.rollouts.get(eval_backend_name(config)).build(config.eval_rollout)


def build_components(dare: Dare, spec: AlgorithmSpec, algorithm_config: Any, rollout_cfg: Any = None) -> Components:
    """The algorithm's components as its workflow runs them: ``spec.build`` through a lookup
    restricted to the names the spec declares, checked against the workflow's bundle, with the
    registry's defaults filled in.

    Args:
        dare: the registries.
        spec: the algorithm.
        algorithm_config: its ``algorithm:`` section.
        rollout_cfg: the training rollout config the lookup shows ``build`` (``None``: none).

    Returns:
        The bundle :attr:`WorkflowSpec.components` names (e.g. :class:`RLComponents`).

    Raises:
        DareError: ``build`` returned another bundle, or a loss lacking its seam's members.
    """
    bundle = dare.registries.workflows.get(spec.workflow).components
    lookup = ComponentLookup(dare.registries, rollout_cfg, spec.components)
    built = spec.build(algorithm_config, lookup)
    if not isinstance(built, bundle):
        raise DareError(
            f"algorithm {spec.name!r}: build returned {type(built).__name__}, but its workflow "
            f"{spec.workflow!r} runs on {bundle.__name__}; return a {bundle.__name__}"
        )
    built.check(spec.name)
    return lookup.with_defaults(built)


@attrs.define
class Context:
    """Everything one run is made of, built once by :func:`setup`."""

    dare: Dare
    config: RunConfig
    spec: AlgorithmSpec
    family: ModelFamily
    wrapper: ModelWrapper
    rollout: RolloutBackend
    eval_rollout: RolloutBackend
    task: Task
    components: Components
    engine: Engine
    rundir: Optional[RunDir]
    generator: torch.Generator
    console: Any = None
    #: the training checkpoint this run continues from (``trainer.resume``), or None
    resume_from: Optional[str] = None

    def bundle(self, cls: type[C]) -> C:
        """The run's components as the bundle ``cls`` of its workflow (which :func:`setup` checked
        ``build`` returned): ``ctx.bundle(RLComponents).trajectory``."""
        if not isinstance(self.components, cls):
            raise DareError(f"this run's components are {type(self.components).__name__}, not {cls.__name__}")
        return self.components

    def stream(self, *key: int) -> torch.Generator:
        """A generator keyed by ``key`` (e.g. the step and a global data position) within the run
        seed: the same draws on every world size, and after a resume."""
        return torch.Generator().manual_seed(derive_seed(self.config.seed, *key))

    def log(self, message: str) -> None:
        """A log line on stderr from the main rank (none with ``dare --quiet``)."""
        if self.engine.is_main:
            info(message)


def setup(
    dare: Dare,
    config: RunConfig,
    *,
    rundir: Optional[RunDir] = None,
    engine: Any = None,
    resume_from: Optional[str] = None,
    task: Any = None,
) -> Context:
    """The run's :class:`Context`; ``task``: the task already built (by the checks before the run)."""
    spec = dare.registries.algorithms.get(config.algo)
    family = dare.registries.models.get(config.model.family)
    task = task if task is not None else dare.registries.tasks.get(config.task.name).build(config.task)
    components = build_components(dare, spec, config.algorithm, config.train_rollout)
    engine = engine if engine is not None else build_engine(dare, config)
    # the samplers need no model: a bad eval rollout config fails before the model is loaded
    rollout = build_rollout(dare, config)
    eval_rollout = build_eval_rollout(dare, config)
    seed_everything(config.seed)  # a freshly initialised model (or adapter) is the same on every rank
    wrapper = load_model(dare, config, device=engine.load_device)
    generator = seed_everything(config.seed, engine.rank)
    train_paths = configure_training_paths(
        wrapper,
        config.model.train_attention,
        config.model.cross_entropy,
        engine.device.type,
        attention_kernel=config.model.attention_kernel,
    )
    engine.prepare(wrapper, trainable=True)
    if rundir is not None and engine.is_main:
        rundir.write_config(to_dict(config))
        rundir.write_json(
            "plugins.json",
            {
                "dare_core": __version__,
                "plugins": [i.as_dict() for i in dare.plugin_infos()],
            },
        )
        rundir.write_json("training_paths.json", train_paths.as_dict())
    ctx = Context(
        dare,
        config,
        spec,
        family,
        wrapper,
        rollout,
        eval_rollout,
        task,
        components,
        engine,
        rundir,
        generator,
        resume_from=resume_from,
    )
    ctx.log(train_paths.describe())
    return ctx


def eval_context(dare: Dare, config: RunConfig, task: Any = None) -> Context:
    """The context of an evaluation without training: model (frozen), eval sampler, task, engine.

    Config errors of the sampler and the checks of :mod:`dare_core.preflight` come before the
    model is loaded; ``task``: the one :func:`~dare_core.preflight.preflight` already returned for
    ``config`` (its checks are not repeated).
    """
    eval_rollout = build_eval_rollout(dare, config)
    task = task if task is not None else preflight(dare, config)
    engine = build_engine(dare, config)
    seed_everything(config.seed)
    wrapper = load_model(dare, config, trainable=False, device=engine.load_device)
    gen = seed_everything(config.seed, engine.rank)
    engine.prepare(wrapper, trainable=False)
    # no algorithm, training rollout or components: the evaluation reads none of them (the
    # training workflows run on setup's context, which has all three)
    return Context(
        dare,
        config,
        cast("AlgorithmSpec", None),
        dare.registries.models.get(config.model.family),
        wrapper,
        cast("RolloutBackend", None),
        eval_rollout,
        task,
        cast("Components", None),
        engine,
        None,
        gen,
    )
