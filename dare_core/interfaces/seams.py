"""The six seams (and the task seam) as typing Protocols plus the specs plugins register.

A plugin registers a *spec* (an attrs class holding a name, help text, capabilities and a
factory); the core builds component objects from specs once per run and the hot loop calls
those objects directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Protocol, Sequence, Union, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

from dare_core.interfaces.batch import Corrupted, RolloutBatch, SequenceBatch
from dare_core.interfaces.rows import TrainingRows, TrajectoryContext
from dare_core.interfaces.update import Totals

DiffusionKind = Literal["masked", "block"]
#: a registered workflow name (``rl``, ``sft``, ``preference``, ...)
WorkflowKind = str


# --------------------------------------------------------------------------- model wrapper
@runtime_checkable
class ModelWrapper(Protocol):
    """A loaded dLLM, with every family difference hidden behind these members.

    ``logits`` and ``denoise_logits`` are aligned so that position ``i`` predicts token ``i``;
    a family whose raw model is shifted (autoregressively initialised) undoes it here.
    :class:`~dare_core.api.HFDiffusionWrapper` gives every member below a default.
    ``lora_target_modules``: module-name suffixes or a regular expression LoRA adapts by default
    (``None``: every linear layer but the output head). ``prompt_len`` (the first response column
    of a ``[prompt | response]`` row) is given by every caller that knows it; a family whose
    denoiser works on the response only (a canvas decoder) needs it, the others ignore it.
    """

    family: str
    kind: DiffusionKind
    capabilities: frozenset[str]
    module: torch.nn.Module
    tokenizer: Any
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    stop_token_ids: tuple[int, ...]
    block_size: Optional[int]
    lora_target_modules: Any

    @property
    def device(self) -> torch.device:
        """The device of the module's parameters."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens removed."""

    def supports_packing(self) -> bool:
        """Whether ``token_logprobs`` can run on packed rows (``model.train_attention=packed``)."""

    def supports_fused_ce(self) -> bool:
        """Whether ``token_logprobs`` can use the logits-free fused cross entropy."""

    def logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Inference forward over ``[B, L]`` ids; returns aligned ``[B, L, V]`` logits."""

    def noise(self, ids: torch.Tensor, where: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``ids`` with the positions ``where`` (broadcast shape) replaced by the family's noise: the
        MASK token (absorbing, ``mask_token`` capability) or uniform random tokens (``uniform_noise``)."""

    def denoise_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """Training forward: logits for ``noisy_ids`` (block families use ``clean_ids`` as the
        clean half of the ``[noisy | clean]`` layout). Returns aligned ``[B, S, V]``."""

    def token_logprobs(
        self,
        noisy_ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """``log p(targets[b, i] | noisy)`` in float32 for every position, shape ``[B, S]``."""

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        """The chat-template text of ``messages`` ending with the assistant header."""

    def decoder_layers(self) -> list[Any]:
        """The network's repeated blocks in order (sharding engines wrap each; activation
        checkpointing recomputes them)."""

    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        """Write the model and tokenizer in the published HF layout; ``state_dict`` (a sharding
        engine's consolidated weights) replaces the module's own."""


@attrs.frozen
class ModelFamily:
    """A model family as registered by a family plugin.

    Attributes:
        name: the ``--model`` name.
        kind: ``masked`` (bidirectional) or ``block`` (block diffusion).
        load: ``load(path, dtype, device) -> ModelWrapper``.
        capabilities: e.g. ``{"bidirectional", "kv_cache", "packed_varlen"}``.
        model_types: HF ``model_type`` values the family loads; listing them declares Hugging
            Face-layout checkpoints, checked before the model loads (:mod:`dare_core.preflight`).
        config_keys: ``config.json`` keys the architecture needs (its sizes), checked present.
        context_key: the ``config.json`` key of the context length (prompt + ``gen_length`` must fit).
        default_checkpoint: path of the bundled tiny checkpoint, or ``None``.
        default_rollout: rollout backend used when the config names none.
        rollouts: rollout backends this family works with (for listings).
        block_size: default block size for block families.
        description: one line for listings.
        create: ``create(out_dir, texts, **sizes)`` writes a new randomly initialised checkpoint
            of this architecture with a small tokenizer trained on ``texts`` (``dare init``).
        load_tokenizer: ``load_tokenizer(path)``, the checkpoint's tokenizer as ``load`` reads it,
            for the pre-flight checks (``None``: ``AutoTokenizer``, no remote code).
    """

    name: str
    kind: DiffusionKind
    load: Callable[..., ModelWrapper]
    capabilities: frozenset[str] = frozenset()
    model_types: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()
    context_key: Optional[str] = "max_position_embeddings"
    default_checkpoint: Optional[str] = None
    default_rollout: str = ""
    rollouts: tuple[str, ...] = ()
    block_size: Optional[int] = None
    description: str = ""
    create: Optional[Callable[..., None]] = None
    load_tokenizer: Optional[Callable[[str], Any]] = None


# --------------------------------------------------------------------------- components
class ForwardCorruption(Protocol):
    """``(batch, generator) -> Corrupted``; drawn once per rollout batch and shared by the old,
    reference and new likelihood evaluations."""

    def __call__(self, wrapper: ModelWrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted: ...


class TrajectoryBuilder(Protocol):
    """Declares what the rollout must record and turns the rollout into training rows.

    ``records``: what the rollout backend must record (``reveal_step``, ``step_states``; empty =
    the final tokens only); the RL loop asks the backend for exactly these and refuses, before any
    work, a backend that cannot record them. ``rows`` returns the training input of one rollout
    batch: the final sequence with the rollout's advantages (:class:`FinalSequence
    <dare_core.components.FinalSequence>`), or several rows per rollout, replayed states, token
    weights and row-aligned ``extras`` for the loss (:class:`~dare_core.interfaces.TrainingRows`).
    """

    records: frozenset[str]

    def rows(self, wrapper: ModelWrapper, rollout: RolloutBatch, context: TrajectoryContext) -> TrainingRows: ...


class LikelihoodEstimator(Protocol):
    """Log-likelihood surrogate of the response.

    Returns ``[M, B, R]`` per-token values (``granularity == "token"``) or ``[M, B]`` per
    sequence. The estimator's docstring states its normaliser.
    """

    granularity: Literal["token", "sequence"]

    def __call__(self, wrapper: ModelWrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor: ...


#: ``estimate(rows) -> [len(rows), B, ...]``: the algorithm's estimator on the given Monte-Carlo
#: rows of the batch's corruption only, with gradients.
RowEstimate = Callable[[Sequence[int]], "torch.Tensor"]


@runtime_checkable
class PolicyLoss(Protocol):
    """The RL objective: ``(loss, metrics)`` of some rows of a mini-batch.

    ``logp``/``old_logp``/``ref_logp`` have the estimator's shape (``[M, B, R]`` per token or
    ``[M, B]`` per sequence; ``ref_logp`` is ``None`` unless ``Components.needs_ref``);
    ``advantages`` is ``[B]``; ``mask`` is ``[B, R]`` (float weights allowed); ``extras`` are the
    trajectory builder's row-aligned tensors (:attr:`TrainingRows.extras`), ``None`` when it gives
    none. ``metrics`` are plain floats. Each loss documents its equation and reference.

    Normalisation is over the whole mini-batch: the loop sums ``totals`` of every micro-batch
    over micro-batches and ranks and passes the sums to every call, so the calls' losses add up
    to the mini-batch objective whatever ``trainer.micro_batch_size`` and the world size.
    """

    def totals(self, mask: torch.Tensor, extras: Optional[dict[str, torch.Tensor]]) -> Totals:
        """What the loss divides by, of these rows (before any forward), e.g. ``mask_totals``."""

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        extras: Optional[dict[str, torch.Tensor]] = None,
        totals: Optional[Totals] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """These rows' numerator over ``totals`` (``None``: ``self.totals(mask, extras)``)."""


class AccumulatingLoss(Protocol):
    """A policy loss that runs its own backward passes, one Monte-Carlo row of the corruption at a
    time (constant memory in the number of rows). Set as ``Components.accumulate``; the RL loop
    calls it instead of ``estimator → loss → backward`` whenever the batch has a corruption.

    ``computes_own_old``: with ``old_logp=None`` the loss takes the old log-likelihoods from its
    own forward passes (detached); otherwise the loop gives it a separate no-grad pass.
    ``accumulate`` adds ``scale · ∇loss`` to the parameters' gradients — through ``backward``
    (the engine's, which a distributed engine needs to see; default ``torch.Tensor.backward``) —
    and returns the detached loss and its metrics; ``totals`` as in :class:`PolicyLoss` (the
    ``Components.loss`` of the algorithm gives them).
    """

    computes_own_old: bool

    def accumulate(
        self,
        estimate: RowEstimate,
        num_rows: int,
        old_logp: Optional[torch.Tensor],
        ref_logp: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        scale: float,
        *,
        extras: Optional[dict[str, torch.Tensor]] = None,
        backward: Callable[[torch.Tensor], None] = ...,
        totals: Optional[Totals] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@runtime_checkable
class SFTObjective(Protocol):
    """The supervised objective of some rows: ``(logp, corrupted, batch) -> (loss, metrics)``
    (``logp`` of the estimator over ``corrupted``), normalised by the step's ``totals`` (summed
    over micro-batches and ranks; ``None``: ``self.totals(batch)``) as in :class:`PolicyLoss`."""

    def totals(self, batch: SequenceBatch) -> Totals: ...

    def __call__(
        self,
        logp: torch.Tensor,
        corrupted: Optional[Corrupted],
        batch: SequenceBatch,
        *,
        totals: Optional[Totals] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@runtime_checkable
class PreferenceLoss(Protocol):
    """The preference objective over interleaved (chosen, rejected) rows:
    ``(logp, ref_logp, batch) -> (loss, metrics)``, normalised by ``totals`` as in
    :class:`SFTObjective`."""

    def totals(self, batch: SequenceBatch) -> Totals: ...

    def __call__(
        self, logp: torch.Tensor, ref_logp: torch.Tensor, batch: SequenceBatch, *, totals: Optional[Totals] = None
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


class AdvantageEstimator(Protocol):
    """``(rewards [N], group_ids [N]) -> advantages [N]``."""

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor: ...


class RolloutBackend(Protocol):
    """A generation engine for one wrapper kind.

    Lockstep (docs/engines.md): every model forward of ``generate`` runs through
    ``wrapper.module``'s forward, so that under an engine whose forwards are collective the loops
    keep a finished rank stepping until every rank is done (:func:`dare_core.api.lockstep`); a
    backend that cannot refuses with a one-line ``DareError`` when ``collective_generation()``."""

    def generate(
        self,
        wrapper: ModelWrapper,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        record: frozenset[str] = frozenset(),
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch: ...


class SyncedRolloutBackend(RolloutBackend, Protocol):
    """A backend running outside the training process (``RolloutSpec.sync``): after every RL step's
    updates each rank gives it the policy — ``(name, tensor)`` pairs (``state``) or the path of an
    HF export (``directory``), LoRA merged, in the checkpoint's names — and ``step`` (0 as the run
    starts; an engine serving several backends loads each step's policy once)."""

    def load_weights(self, weights: Any, step: int) -> None: ...


@attrs.frozen
class ComponentSpec:
    """A registered corruption / trajectory builder / estimator / loss / advantage estimator.

    ``factory(**kwargs)`` builds the component object; ``kinds`` lists the wrapper kinds it
    supports (empty = all); ``requires`` lists wrapper capabilities it needs; ``needs_groups``: an
    advantage estimator comparing a prompt's rollouts (``trainer.group_size=1`` is refused)."""

    name: str
    factory: Callable[..., Any]
    description: str = ""
    kinds: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()
    reference: str = ""
    needs_groups: bool = False


@attrs.frozen
class RolloutSpec:
    """A registered rollout backend.

    Attributes:
        config_cls: frozen attrs class of its ``rollout:`` config section.
        build: ``build(config) -> RolloutBackend``.
        kinds: wrapper kinds it can drive.
        records: what it can record (``"reveal_step"``, ...).
        requires: wrapper capabilities it needs.
        methods: optional backend methods it offers beyond ``generate`` (``"continue_from"``:
            resume partial responses over a step range; ``"total_steps"``: the number of steps a
            run takes); an algorithm that wraps the rollout declares the ones it calls.
        sync: ``""`` (runs in the training process on the live module) or how the RL loop pushes
            the updated policy to it (:class:`SyncedRolloutBackend`): ``"state"`` or ``"directory"``.
    """

    name: str
    config_cls: type
    build: Callable[[Any], RolloutBackend]
    kinds: frozenset[str] = frozenset()
    records: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()
    methods: frozenset[str] = frozenset()
    description: str = ""
    sync: Literal["", "state", "directory"] = ""


@attrs.frozen
class Components:
    """The objects one algorithm run is made of; built once by ``AlgorithmSpec.build``.

    Every member the loops use, with its default:

    * ``estimator`` (:class:`LikelihoodEstimator`) and ``loss`` (:class:`PolicyLoss`,
      :class:`SFTObjective` or :class:`PreferenceLoss`, by the algorithm's workflow);
    * ``corruption`` (:class:`ForwardCorruption`, ``None`` = the estimator needs none);
    * ``trajectory`` (:class:`TrajectoryBuilder`, ``None`` = the final sequence);
    * ``advantage`` (:class:`AdvantageEstimator`, ``None`` = group-normalised rewards);
    * ``accumulate`` (:class:`AccumulatingLoss`, ``None`` = the loop differentiates ``loss``);
    * ``needs_ref``: reference log-likelihoods from a frozen copy of the initial policy;
    * ``remask_each_epoch``: a new corruption for each PPO epoch (all drawn, with their old and
      reference log-likelihoods, before the first update; ``False`` = one per rollout batch);
    * ``collate(prompts, responses, wrapper) -> SequenceBatch`` (SFT; ``None`` = pad id, padding
      not attended);
    * what the training rollout needs is declared on the spec (:class:`RolloutNeeds`).
    """

    estimator: LikelihoodEstimator
    loss: Union[PolicyLoss, SFTObjective, PreferenceLoss]
    corruption: Optional[ForwardCorruption] = None
    trajectory: Optional[TrajectoryBuilder] = None
    advantage: Optional[AdvantageEstimator] = None
    accumulate: Optional[AccumulatingLoss] = None
    needs_ref: bool = False
    remask_each_epoch: bool = False
    collate: Optional[Callable[..., SequenceBatch]] = None


@attrs.frozen
class RolloutNeeds:
    """What an RL algorithm needs from its training rollout, declared once on its spec.

    Config resolution reads it to pick a default backend that serves the algorithm, derives the
    training rollout config once (``RunConfig.train_rollout``; evaluation keeps the run's) and
    refuses a backend lacking what it needs before any work; the RL loop wraps the one training
    backend it builds.

    Attributes:
        records: what the trajectory builders may need the rollout to record, for any options
            (the contract suite checks the built builder's ``records`` are among them).
        fields: rollout config fields ``adjust`` / ``wrap`` read or set (e.g. ``block_length``).
        methods: backend methods ``wrap`` calls beyond ``generate`` (e.g. ``continue_from``).
        adjust: ``adjust(algorithm_config, rollout_config) -> rollout_config``, pure: the training
            rollout config (e.g. one token per step, left to right); ``None`` = the run's.
        wrap: ``wrap(backend, run_config) -> RolloutBackend`` around the training backend (e.g. a
            tree of partial denoising runs); ``None`` = the backend itself.
    """

    records: frozenset[str] = frozenset()
    fields: frozenset[str] = frozenset()
    methods: frozenset[str] = frozenset()
    adjust: Optional[Callable[[Any, Any], Any]] = None
    wrap: Optional[Callable[[RolloutBackend, Any], RolloutBackend]] = None


@attrs.frozen
class AlgorithmSpec:
    """An algorithm as registered by an algorithm plugin.

    Attributes:
        name: the ``--algo`` name.
        workflow: which registered workflow runs it (``rl``, ``sft``, ``preference``, ...).
        config_cls: frozen attrs class of the ``algorithm:`` section (recipe defaults).
        build: ``build(config, lookup) -> Components``; ``lookup`` builds registered
            components by name (:class:`dare_core.components.ComponentLookup`).
        requires: model capabilities it needs; the CLI refuses models lacking one.
        kinds: model kinds it supports (empty = all).
        components: the registered component names it composes, by role (a name, or a tuple of
            alternatives it chooses between by model kind): the one place an algorithm names
            them. ``build`` asks its lookup for a role (``lookup.loss(**options)``) and names one
            only to choose between alternatives; the lookup refuses any other name. Roles not
            listed get the core's defaults (:data:`dare_core.components.DEFAULTS`).
        rollout: what its training rollout needs (:class:`RolloutNeeds`; RL only).
        paper: reference (title, arXiv id).
        description: one line.
        recipe: defaults for other run-config sections (``{"trainer": {"lr": 5e-7}}``), applied
            below a checkpoint's preset, the config file and overrides.
    """

    name: str
    workflow: WorkflowKind
    config_cls: type
    build: Callable[..., Components]
    requires: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    components: dict[str, Any] = attrs.field(factory=dict)
    rollout: RolloutNeeds = RolloutNeeds()
    paper: str = ""
    description: str = ""
    recipe: dict[str, Any] = attrs.field(factory=dict)


# --------------------------------------------------------------------------- config sections
@attrs.frozen
class ConfigSection:
    """A top-level section of the run config owned by a plugin (e.g. ``tracking:``).

    Attributes:
        name: the section's key in the run config (``<name>.<field>=value`` on the command
            line); it must not be a key of the core's ``RunConfig``.
        config_cls: frozen attrs class of the section (help text on every field); a config
            that does not give the section gets its defaults.
        description: one line, shown as the section's help by ``dare config show``.
    """

    name: str
    config_cls: type
    description: str = ""


# --------------------------------------------------------------------------- tasks
@attrs.define
class Example:
    """One dataset item in the verl schema.

    Attributes:
        prompt: chat messages ``[{"role": ..., "content": ...}]``.
        ground_truth: ``reward_model.ground_truth``.
        data_source: ``data_source`` (selects the reward rule).
        extra_info: ``extra_info`` (numbers, puzzle, index, ...).
        response: a reference answer text for supervised training, if known.
    """

    prompt: list[dict[str, str]]
    ground_truth: str
    data_source: str
    extra_info: dict[str, Any] = attrs.field(factory=dict)
    response: Optional[str] = None


@attrs.frozen
class Score:
    """A reward: ``score`` (the training reward, partial credit allowed), ``acc`` (1.0 iff fully
    correct; the training reward instead with ``task.reward=acc``), ``pred`` (the extracted
    answer), ``kind`` (how the item failed or passed, e.g. a code task's ``passed``, ``wrong``,
    ``error``, ``timeout``, ``memory``, ``killed``; empty where the task has none)."""

    score: float
    acc: float
    pred: str = ""
    kind: str = ""


class Task(Protocol):
    """A dataset plus its reward rule."""

    name: str

    def examples(self, split: str, limit: Optional[int] = None, seed: int = 0) -> list[Example]:
        """Items of ``split`` (``train`` or ``eval``); deterministic for a given seed."""

    def score(self, example: Example, response: str) -> Score:
        """Reward of ``response`` (decoded text, special tokens removed) for ``example``."""


@attrs.frozen
class TaskSpec:
    """A registered task: ``build(task_config) -> Task``; ``max_score``: the largest
    ``Score.score`` a response can get (``None``: unknown, so the RL loop reports no
    ``solved_group_frac`` under ``task.reward=score``; ``Score.acc`` is at most 1)."""

    name: str
    build: Callable[..., Task]
    description: str = ""
    max_score: Optional[float] = None
