"""The six seams (and the task seam) as typing Protocols plus the specs plugins register.

A plugin registers a *spec* (an attrs class holding a name, help text, capabilities and a
factory); the core builds component objects from specs once per run and the hot loop calls
those objects directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, Optional, Protocol, Sequence, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

from dare_core.errors import DareError
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

    Shapes: ``B`` rows, ``L`` / ``S`` sequence length (``S = P + R`` for ``[prompt | response]``
    rows), ``V`` vocabulary. Token ids are ``long``; an ``attention_mask`` is 1 on valid tokens,
    0 on padding.

    Attributes:
        family: the registered :attr:`ModelFamily.name`.
        kind: ``masked`` or ``block``.
        capabilities: what the family declares (``mask_token``, ``absorbing_elbo``, ...).
        module: the ``torch.nn.Module`` engines prepare and optimise.
        tokenizer: the checkpoint's tokenizer.
        mask_token_id, eos_token_id, pad_token_id: special token ids from the checkpoint.
        stop_token_ids: ids that end a response (default: the EOS id).
        block_size: the block length of a block family (``None`` for masked families).
        lora_target_modules: see above.
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
        """The device of the module's parameters (where the loops put prompts and batches)."""

    def encode(self, text: str) -> list[int]:
        """Tokenize ``text``.

        Args:
            text: a prompt or a reference response.

        Returns:
            its token ids, no special tokens added.
        """

    def decode(self, ids: list[int]) -> str:
        """Detokenize a response.

        Args:
            ids: token ids (the valid part of a response row).

        Returns:
            the text, special tokens removed.
        """

    def supports_packing(self) -> bool:
        """Whether ``token_logprobs`` can run on packed rows (``model.train_attention=packed``).

        Returns:
            ``True`` when the padded and the packed layout give the same log-probabilities.
        """

    def supports_fused_ce(self) -> bool:
        """Whether ``token_logprobs`` can use the logits-free fused cross entropy.

        Returns:
            ``True`` when the output head can be applied chunk by chunk after the forward.
        """

    def logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Inference forward (rollouts, evaluation).

        Args:
            input_ids: ``[B, L]`` token ids, MASK (or noise) tokens where not yet decoded.
            attention_mask: ``[B, L]``, 1 on valid tokens; ``None``: every token is valid.

        Returns:
            ``[B, L, V]`` logits, aligned so that position ``i`` predicts token ``i``.
        """

    def noise(self, ids: torch.Tensor, where: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The family's forward-noise kernel, what corruptions and samplers call to corrupt tokens.

        Args:
            ids: token ids, e.g. ``[B, S]`` (or ``[M, B, S]``).
            where: bool, broadcastable with ``ids`` (e.g. ``[M, B, S]``): the positions to corrupt.
            generator: the random stream of uniform noise (CPU); absorbing families ignore it.

        Returns:
            ``ids`` in the broadcast shape of ``ids`` and ``where``, with the positions ``where``
            replaced by the MASK token (absorbing, ``mask_token`` capability) or by uniform
            random tokens (``uniform_noise``).
        """

    def denoise_logits(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """Training forward of one corruption row.

        Args:
            noisy_ids: ``[B, S]`` model inputs (a row of :attr:`Corrupted.noisy_ids`).
            attention_mask: ``[B, S]``, 1 on valid tokens; ``None``: every token is valid.
            clean_ids: ``[B, S]`` clean sequence; block families use it as the clean half of the
                ``[noisy | clean]`` layout, the others ignore it.
            prompt_len: ``P``, the first response column (see above).

        Returns:
            ``[B, S, V]`` logits, aligned so that position ``i`` predicts token ``i``.
        """

    def token_logprobs(
        self,
        noisy_ids: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.Tensor] = None,
        prompt_len: Optional[int] = None,
    ) -> torch.Tensor:
        """Log-probabilities of the targets under one corruption row: what every estimator reads.

        Args:
            noisy_ids: ``[B, S]`` model inputs, as for :meth:`denoise_logits`.
            targets: ``[B, S]`` token ids to score (the clean sequence).
            attention_mask: ``[B, S]``, 1 on valid tokens; ``None``: every token is valid.
            clean_ids: ``[B, S]``, as for :meth:`denoise_logits`.
            prompt_len: ``P``, as for :meth:`denoise_logits`.

        Returns:
            ``[B, S]`` float32, ``log p(targets[b, i] | noisy_ids[b])`` at every position ``i``
            (the packed path gives 0 at padding); differentiable.
        """

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        """Render a task prompt for generation.

        Args:
            messages: chat messages ``[{"role": ..., "content": ...}]`` (:attr:`Example.prompt`).

        Returns:
            the chat-template text, ending with the assistant header.
        """

    def decoder_layers(self) -> list[Any]:
        """The network's repeated blocks.

        Returns:
            the blocks in order (sharding engines wrap each; activation checkpointing recomputes
            them).
        """

    def save_pretrained(self, path: str, state_dict: Optional[dict] = None) -> None:
        """Write the model and tokenizer in the published HF layout.

        Args:
            path: the output directory.
            state_dict: a sharding engine's consolidated weights, written instead of the module's
                own; ``None``: the module's.
        """


@attrs.frozen
class ModelFamily:
    """A model family as registered by a family plugin.

    Attributes:
        name: the ``--model`` name.
        kind: ``masked`` (bidirectional) or ``block`` (block diffusion).
        load: ``load(path, dtype=..., device=..., attn_implementation=None) -> ModelWrapper``
            (``attn_implementation``: ``model.attn_implementation``, ``None`` unless set;
            ``device="meta"``: the structure only — parameters on the meta device with the
            checkpoint's names, buffers computed, weights tied — for an engine whose ``prepare``
            fills its shards from the checkpoint, :attr:`Engine.load_device`).
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
    """``(wrapper, batch, generator) -> Corrupted``: the forward noise process of an algorithm.

    The RL loop draws it once per rollout batch (once per PPO epoch with
    ``RLComponents.remask_each_epoch``), over the global batch, and shares it between the old,
    reference and new likelihood evaluations; the supervised and preference loops draw it once
    per step. All randomness comes from ``generator``.
    """

    def __call__(self, wrapper: ModelWrapper, batch: SequenceBatch, generator: torch.Generator) -> Corrupted:
        """Corrupt a batch.

        Args:
            wrapper: the policy (its ``noise`` kernel and ``mask_token_id``).
            batch: ``[B, S]`` sequences; ``input_ids`` are the clean tokens.
            generator: the step's seeded CPU stream (draw on the CPU and move, or through
                ``dare_core.api.for_device``).

        Returns:
            :class:`Corrupted` with ``noisy_ids`` / ``masked`` / ``p_mask`` ``[M, B, S]`` and
            ``extras`` with the batch on dim 1.
        """


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

    def rows(self, wrapper: ModelWrapper, rollout: RolloutBatch, context: TrajectoryContext) -> TrainingRows:
        """The training rows of one rollout batch (this rank's ``B`` rollouts).

        Args:
            wrapper: the policy.
            rollout: prompts ``[B, P]``, responses ``[B, R]`` and what ``records`` asked for
                (``reveal_step`` ``[B, R]``, ``extras``).
            context: rewards, advantages and group ids ``[B]``, the score function, the step
                and the run's random stream (:class:`~dare_core.interfaces.TrajectoryContext`).

        Returns:
            :class:`~dare_core.interfaces.TrainingRows` of ``N`` rows (``N`` may exceed ``B``):
            ``batch`` ``[N, S]``, ``advantages`` ``[N]``, optional ``corrupted`` ``[M, N, S]``,
            ``weights`` ``[N, R]`` or ``[M, N, R]``, ``extras`` (dim 0 = ``N``) and ``metrics``.
        """


class LikelihoodEstimator(Protocol):
    """Log-likelihood surrogate of the response, per token (``granularity == "token"``) or per
    sequence (``"sequence"``). The estimator's docstring states its normaliser.

    The batch is on dim 1 of the result: the loops concatenate micro-batches and select rows
    along it, and the same estimator gives the old, reference and new values.
    """

    granularity: Literal["token", "sequence"]

    def __call__(self, wrapper: ModelWrapper, batch: SequenceBatch, corrupted: Optional[Corrupted]) -> torch.Tensor:
        """Estimate the log-likelihood of some rows.

        Args:
            wrapper: the policy, or the reference policy for ``ref_logp``.
            batch: ``[B, S]`` sequences; ``input_ids`` are the likelihood targets.
            corrupted: the rows' corruption ``[M, B, S]`` (or the trajectory builder's states);
                ``None`` when the algorithm has no corruption.

        Returns:
            float ``[M, B, R]`` per response token (or ``[M, B, S]`` per position, e.g.
            ``masked_token_logprob``, for an objective that reads them so), or ``[M, B]`` per
            sequence; differentiable (the loops add ``torch.no_grad`` for old and reference values).
        """


#: ``estimate(rows) -> [len(rows), B, ...]``: the algorithm's estimator on the given Monte-Carlo
#: rows of the batch's corruption only, with gradients.
RowEstimate = Callable[[Sequence[int]], "torch.Tensor"]


@runtime_checkable
class PolicyLoss(Protocol):
    """The RL objective: ``(loss, metrics)`` of some rows of a mini-batch.

    ``logp``/``old_logp``/``ref_logp`` have the estimator's shape (``[M, B, R]`` per token or
    ``[M, B]`` per sequence; ``ref_logp`` is ``None`` unless ``RLComponents.needs_ref``);
    ``advantages`` is ``[B]``; ``mask`` is the rows' loss weights, ``[B, R]`` (float weights
    allowed) or ``[M, B, R]`` when the trajectory builder gives weights per corruption row
    (:meth:`TrainingRows.loss_weights`); ``extras`` are the trajectory builder's row-aligned
    tensors (:attr:`TrainingRows.extras`), ``None`` when it gives none. ``metrics`` are plain
    floats. Each loss documents its equation and reference.

    Normalisation is over the whole mini-batch: the loop sums ``totals`` of every micro-batch
    over micro-batches and ranks and passes the sums to every call, so the calls' losses add up
    to the mini-batch objective whatever ``trainer.micro_batch_size`` and the world size.
    """

    def totals(self, mask: torch.Tensor, extras: Optional[dict[str, torch.Tensor]]) -> Totals:
        """What the loss divides by, of these rows, computed before any forward.

        Args:
            mask: the rows' loss weights, ``[B, R]`` or ``[M, B, R]``.
            extras: the rows' extras (dim 0 = ``B``), ``None`` when the builder gives none.

        Returns:
            additive float64 statistics (e.g. ``mask_totals(mask)``: ``tokens``, ``rows``,
            ``cells``); the loop sums them over the mini-batch's micro-batches and ranks.
        """

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
        """These rows' share of the mini-batch loss.

        Args:
            logp: the policy's estimate, ``[M, B, R]`` or ``[M, B]``, with gradients.
            old_logp: the rollout policy's, same shape, no gradients (``logp.detach()`` when the
                batch gets one optimizer step and ``trainer.reuse_logprob`` is on).
            ref_logp: the reference policy's, same shape; ``None`` unless ``RLComponents.needs_ref``.
            advantages: ``[B]`` one scalar per row.
            mask: ``[B, R]`` or ``[M, B, R]`` loss weights.
            extras: the rows' extras (dim 0 = ``B``); ``None`` when the builder gives none.
            totals: the mini-batch's summed :meth:`totals`; ``None``: ``self.totals(mask, extras)``.

        Returns:
            ``(loss, metrics)``: the rows' numerator over ``totals``, a scalar with gradients
            (the loop backpropagates it scaled by the world size), and plain-float metrics.
        """


class AccumulatingLoss(Protocol):
    """A policy loss that runs its own backward passes, one Monte-Carlo row of the corruption at a
    time (constant memory in the number of rows). Set as ``RLComponents.accumulate``; the RL loop
    calls it instead of ``estimator → loss → backward`` whenever the batch has a corruption.

    ``computes_own_old``: with ``old_logp=None`` the loss takes the old log-likelihoods from its
    own forward passes (detached); otherwise the loop gives it a separate no-grad pass.
    ``accumulate`` adds ``scale · ∇loss`` to the parameters' gradients — through ``backward``
    (the engine's, which a distributed engine needs to see; default ``torch.Tensor.backward``) —
    and returns the detached loss and its metrics; ``totals`` as in :class:`PolicyLoss` (the
    ``RLComponents.loss`` of the algorithm gives them).
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
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Accumulate the gradient of these rows' loss, one Monte-Carlo row at a time.

        Args:
            estimate: ``estimate(rows) -> [len(rows), B, ...]`` (:data:`RowEstimate`), the
                estimator on the given corruption rows, with gradients.
            num_rows: ``M``, the number of corruption rows.
            old_logp: ``[M, B, R]`` or ``[M, B]``, no gradients; ``None`` only when
                ``computes_own_old``.
            ref_logp: same shape; ``None`` unless ``RLComponents.needs_ref``.
            advantages: ``[B]``.
            mask: ``[B, R]`` or ``[M, B, R]`` loss weights.
            scale: the factor of every backward (the world size).
            extras: the rows' extras (dim 0 = ``B``); ``None`` when the builder gives none.
            backward: the engine's backward, called on each scaled partial loss.
            totals: the mini-batch's summed totals (``RLComponents.loss.totals``).

        Returns:
            ``(loss, metrics)``: the detached loss of the rows and plain-float metrics.
        """


@runtime_checkable
class SFTObjective(Protocol):
    """The supervised objective of some rows: ``(logp, corrupted, batch) -> (loss, metrics)``
    (``logp`` of the estimator over ``corrupted``), normalised by the step's ``totals`` (summed
    over micro-batches and ranks; ``None``: ``self.totals(batch)``) as in :class:`PolicyLoss`."""

    def totals(self, batch: SequenceBatch) -> Totals:
        """What the objective divides by, of these rows, computed before any forward.

        Args:
            batch: ``[B, S]`` rows of a micro-batch.

        Returns:
            additive float64 statistics (e.g. target tokens, rows).
        """

    def __call__(
        self,
        logp: torch.Tensor,
        corrupted: Optional[Corrupted],
        batch: SequenceBatch,
        *,
        totals: Optional[Totals] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """These rows' share of the step's supervised loss.

        Args:
            logp: the estimator over ``corrupted``, with the rows on dim 1 (e.g. ``[M, B, S]``).
            corrupted: the rows' corruption ``[M, B, S]`` (``p_mask`` for ELBO weights); ``None``
                when the algorithm has none.
            batch: ``[B, S]`` rows (``input_ids`` the targets, ``response_mask`` what is trained).
            totals: the step's summed :meth:`totals`; ``None``: ``self.totals(batch)``.

        Returns:
            ``(loss, metrics)``: a scalar with gradients and plain-float metrics.
        """


@runtime_checkable
class PreferenceLoss(Protocol):
    """The preference objective over interleaved (chosen, rejected) rows:
    ``(logp, ref_logp, batch) -> (loss, metrics)``, normalised by ``totals`` as in
    :class:`SFTObjective`."""

    def totals(self, batch: SequenceBatch) -> Totals:
        """What the objective divides by, of these rows (e.g. their pairs), before any forward.

        Args:
            batch: ``[2N, S]`` interleaved rows of a micro-batch (row ``2i`` chosen, ``2i + 1``
                rejected).

        Returns:
            additive float64 statistics.
        """

    def __call__(
        self, logp: torch.Tensor, ref_logp: torch.Tensor, batch: SequenceBatch, *, totals: Optional[Totals] = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """These pairs' share of the step's preference loss.

        Args:
            logp: the policy's estimate with the rows on dim 1 (``[M, 2N, ...]``), with gradients.
            ref_logp: the reference policy's under the same corruption, same shape.
            batch: ``[2N, S]`` interleaved rows.
            totals: the step's summed :meth:`totals`; ``None``: ``self.totals(batch)``.

        Returns:
            ``(loss, metrics)``: a scalar with gradients and plain-float metrics.
        """


class AdvantageEstimator(Protocol):
    """``(rewards [N], group_ids [N]) -> advantages [N]``; groups are the ``trainer.group_size``
    rollouts of one prompt."""

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Advantages of this rank's rollouts.

        Args:
            rewards: ``[N]`` float32 task rewards (CPU).
            group_ids: ``[N]`` long, the prompt group of every rollout (CPU).

        Returns:
            ``[N]`` float advantages (the loop moves them to the model's device).
        """


class RolloutBackend(Protocol):
    """A generation engine for one wrapper kind.

    Lockstep (docs/engines.md): every model forward of ``generate`` runs through
    ``wrapper.module``'s forward, so that under an engine whose forwards are collective the loops
    keep a finished rank stepping until every rank is done (:func:`dare_core.api.lockstep`); a
    backend that cannot refuses with a one-line ``DareError`` when ``collective_generation()``.

    Optional methods, offered by a backend that lists them in :attr:`RolloutSpec.methods` and
    called only by an algorithm that declares them in :attr:`RolloutNeeds.methods`:
    ``total_steps(wrapper, prompt_mask [B, P]) -> int`` (the global denoising steps of a full
    run) and ``continue_from(wrapper, prompt_ids [B, P], prompt_mask [B, P], response [B, R], *,
    start_step, stop_step, generator=None) -> RolloutBatch`` (denoise partial responses over the
    global steps ``[start_step, stop_step)``, drawing the random stream as ``generate`` would).
    """

    def generate(
        self,
        wrapper: ModelWrapper,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        record: frozenset[str] = frozenset(),
        generator: Optional[torch.Generator] = None,
    ) -> RolloutBatch:
        """Generate one response per prompt row (training rollouts, evaluation, ``dare generate``).

        Args:
            wrapper: the policy (its live module; a synced backend uses its own copy).
            prompt_ids: ``[B, P]`` left-padded prompt ids on the wrapper's device (RL repeats
                each prompt ``trainer.group_size`` times).
            prompt_mask: ``[B, P]``, 1 on prompt tokens.
            record: what to record besides the tokens (the trajectory builder's ``records``,
                each among :attr:`RolloutSpec.records`); empty: nothing.
            generator: the call's seeded CPU stream; ``None``: unseeded (the caller fixes no draws).

        Returns:
            :class:`~dare_core.interfaces.RolloutBatch` of the ``B`` rows: ``response_ids`` /
            ``response_mask`` ``[B, R]``, ``reveal_step`` ``[B, R]`` when recorded, ``extras``
            for the other records, ``num_steps`` and ``nfe``.
        """


class SyncedRolloutBackend(RolloutBackend, Protocol):
    """A backend running outside the training process (``RolloutSpec.sync``): after every RL step's
    updates each rank gives it the policy — ``(name, tensor)`` pairs (``state``) or the path of an
    HF export (``directory``), LoRA merged, in the checkpoint's names — and ``step`` (0 as the run
    starts; an engine serving several backends loads each step's policy once)."""

    def load_weights(self, weights: Any, step: int) -> None:
        """Take the updated policy (called on every rank; collective for the trainer).

        Args:
            weights: ``sync="state"``: an iterable of ``(name, tensor)`` pairs, the full state
                dict; ``sync="directory"``: the path of the HF export ``<run>/rollout-policy``.
            step: the optimizer steps the policy has had in this process (0: as the run
                starts or resumes).
        """


@attrs.frozen
class ComponentSpec:
    """A registered corruption / trajectory builder / estimator / loss / advantage estimator.

    Attributes:
        name: the registered name (``AlgorithmSpec.components`` and ``ComponentLookup`` use it).
        factory: ``factory(**kwargs)`` builds the component object (usually the class itself).
        description: one line for ``dare list``.
        kinds: wrapper kinds it supports (empty = all).
        requires: wrapper capabilities it needs.
        reference: the paper or source it implements (e.g. an arXiv id).
        needs_groups: an advantage estimator comparing a prompt's rollouts
            (``trainer.group_size=1`` is refused).
    """

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


@attrs.frozen(kw_only=True)
class Components:
    """The objects one algorithm run is made of, built once by ``AlgorithmSpec.build``: the base
    of the bundle each workflow runs on (:attr:`WorkflowSpec.components`).

    A workflow's bundle narrows ``loss`` to its loss seam (``loss_seam``) and adds the members its
    loop reads; config resolution refuses, before any work, a build that returns another bundle
    or a loss lacking a member of the seam (:meth:`check`).

    Attributes:
        estimator: the likelihood estimator (:class:`LikelihoodEstimator`).
        corruption: the forward corruption (:class:`ForwardCorruption`); ``None`` = the
            estimator needs none.
        loss: the workflow's loss (its bundle names the seam).
    """

    #: the runtime-checkable Protocol ``loss`` implements (set by each bundle)
    loss_seam: ClassVar[type] = object

    estimator: LikelihoodEstimator
    corruption: Optional[ForwardCorruption] = None
    loss: object

    def check(self, algorithm: str) -> None:
        """Refuse a loss that lacks a member of the bundle's ``loss_seam`` (e.g. ``totals``, which
        the loops normalise by).

        Args:
            algorithm: the ``--algo`` name, for the message.

        Raises:
            DareError: naming the loss, the seam and the fix.
        """
        if not isinstance(self.loss, self.loss_seam):
            raise DareError(
                f"the loss {type(self.loss).__name__} of algorithm {algorithm!r} lacks a member of the "
                f"{self.loss_seam.__name__} seam (totals(...) and __call__(..., totals=None)), which "
                "the loops normalise by; implement it"
            )


@attrs.frozen(kw_only=True)
class RLComponents(Components):
    """The RL workflow's bundle.

    Attributes:
        loss: :class:`PolicyLoss`.
        trajectory: :class:`TrajectoryBuilder`; ``None`` = the registry's default
            (``final_sequence``), filled in by the lookup.
        advantage: :class:`AdvantageEstimator`; ``None`` = the registry's default
            (``group_norm``), filled in by the lookup.
        accumulate: :class:`AccumulatingLoss`; ``None`` = the loop differentiates ``loss``.
        needs_ref: reference log-likelihoods from a frozen copy of the initial policy.
        remask_each_epoch: a new corruption for each PPO epoch (all drawn, with their old and
            reference log-likelihoods, before the first update; ``False`` = one per rollout batch).

    What the training rollout needs is declared on the spec (:class:`RolloutNeeds`).
    """

    loss_seam: ClassVar[type] = PolicyLoss

    loss: PolicyLoss
    trajectory: Optional[TrajectoryBuilder] = None
    advantage: Optional[AdvantageEstimator] = None
    accumulate: Optional[AccumulatingLoss] = None
    needs_ref: bool = False
    remask_each_epoch: bool = False


@attrs.frozen(kw_only=True)
class SFTComponents(Components):
    """The SFT workflow's bundle.

    Attributes:
        loss: :class:`SFTObjective`.
        collate: ``collate(prompts, responses, wrapper) -> SequenceBatch``; ``None`` = pad id,
            padding not attended.
    """

    loss_seam: ClassVar[type] = SFTObjective

    loss: SFTObjective
    collate: Optional[Callable[..., SequenceBatch]] = None


@attrs.frozen(kw_only=True)
class PreferenceComponents(Components):
    """The preference workflow's bundle (the reference policy is always evaluated).

    Attributes:
        loss: :class:`PreferenceLoss`.
    """

    loss_seam: ClassVar[type] = PreferenceLoss

    loss: PreferenceLoss


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
        build: ``build(config, lookup) -> Components``, the bundle its workflow names
            (:attr:`WorkflowSpec.components`); ``lookup`` builds the registered components the
            spec declares (:class:`dare_core.components.ComponentLookup`).
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
            below a checkpoint's preset, the config file and overrides (its ``rollout`` keys
            where the chosen backend has them).
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
        """The items of a split.

        Args:
            split: ``train`` or ``eval``.
            limit: at most this many items (``task.num_eval`` for evaluation); ``None``: all.
            seed: the run's seed.

        Returns:
            the items, deterministic for a given seed.
        """

    def score(self, example: Example, response: str) -> Score:
        """Reward a response.

        Args:
            example: the item the response answers.
            response: the decoded response text, special tokens removed.

        Returns:
            its :class:`Score`.
        """


@attrs.frozen
class TaskSpec:
    """A registered task.

    Attributes:
        name: the ``task.name`` value.
        build: ``build(task_config) -> Task`` (``task_config``: the run's ``task:`` section).
        description: one line for ``dare list tasks``.
        max_score: the largest ``Score.score`` a response can get (``None``: unknown, so the RL
            loop reports no ``solved_group_frac`` under ``task.reward=score``; ``Score.acc`` is
            at most 1).
    """

    name: str
    build: Callable[..., Task]
    description: str = ""
    max_score: Optional[float] = None
