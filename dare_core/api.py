"""The public API of dare-core for plugin authors: what a family, algorithm, rollout backend, task,
command or observer plugin may import (the seams, generic components, config, errors, model
wrappers, training paths, the runtime commands drive). Other ``dare_core`` modules are private;
the testing kit is :mod:`dare_core.testing`.

Names resolve on first use (PEP 562), so importing this module, or a light name from it
(``hookimpl``, ``lazy``, the specs, ``option``), imports neither torch nor model code."""

import importlib

#: module -> the names it exports here: what plugins, libraries, ``contrib/``, ``research/``,
#: ``scripts/`` and the plugin templates import, and the names the docs give plugin authors (the
#: seams, the run ``Context``, ``Tracker``, the batch stream, ``SingleProcessEngine``,
#: ``ProcessGroup``, ...). ``tests/test_core_layout.py`` holds the same list (``PUBLIC_API``) and
#: fails when the two differ, when a name is neither used nor documented, or when a distribution
#: imports a name that is not here.
_EXPORTS = {
    "dare_core.components": "ComponentLookup corrupted_logprobs",
    "dare_core.components.advantages": "GroupNormAdvantage",
    "dare_core.components.corruptions": "RandomRatioMasking mask_tokens",
    "dare_core.components.estimators": "MaskedTokenLogProb",
    "dare_core.components.losses": "ClippedPolicyLoss agg_loss kl_penalty mask_totals masked_mean sum_totals",
    "dare_core.components.trajectories": "FinalSequence",
    "dare_core.config": "RunConfig TaskConfig option resolve structure to_dict",
    "dare_core.config.loader": "misfit parse_overrides",
    "dare_core.config.validators": "divides in_range non_negative one_of optional positive probability",
    "dare_core.console": "info quiet",
    "dare_core.errors": "CapabilityError ConfigError DareError DivergenceError PromptFitError run_script",
    "dare_core.interfaces": "AccumulatingLoss AdvantageEstimator AlgorithmSpec Components ComponentSpec ConfigSection "
    "Corrupted Engine EngineSpec Example ForwardCorruption LikelihoodEstimator ModelFamily "
    "ModelWrapper PolicyLoss PreferenceComponents PreferenceLoss RLComponents RolloutBackend RolloutBatch "
    "RolloutNeeds RolloutSpec RowEstimate SFTComponents SFTObjective Score SequenceBatch SyncedRolloutBackend Task TaskSpec Totals "
    "TrainingRows TrajectoryBuilder TrajectoryContext UpdateBatch UpdateObjective WorkflowSpec",
    "dare_core.models.base": "HFDiffusionWrapper gather_logprobs no_hf_progress_bar",
    "dare_core.ops.attention": "HALF DocumentMask available_kernels cu_seqlens document_mask",
    "dare_core.ops.fused_ce": "DEFAULT_CHUNK_ELEMENTS chunk_rows fused_token_logprobs naive_token_logprobs",
    "dare_core.ops.packing": "plan_packing",
    "dare_core.ops.paths": "configure_training_paths param_dtype select_training_paths",
    "dare_core.pairing": "compare describe paired_counts",
    "dare_core.plugins": "build get_dare hookimpl lazy",
    "dare_core.rng": "for_device",
    "dare_core.preflight": "context_length preflight",
    "dare_core.rundir": "RunDir atomic_write_file atomic_write_text",
    "dare_core.workflows.batching": "STREAM_CORRUPTION STREAM_DATA BatchStream chunks decode_responses "
    "encode_prompts left_pad",
    "dare_core.workflows.evaluation": "evaluate",
    "dare_core.workflows.rl": "PolicyObjective ReferencePolicy collect estimate_no_grad "
    "rows_update_batch training_rollout",
    "dare_core.workflows.runtime": "Context build_components build_rollout eval_backend_name eval_context setup",
    "dare_core.workflows.sft": "default_collate",
    "dare_core.workflows.update": "UpdatePlan UpdateStats backward_minibatch update",
    "dare_core.workflows.tracker": "Tracker",
    "dare_core.engines.common": "adamw cast_for_precision lr_at set_lr trainable_parameters",
    "dare_core.engines.distributed": "ProcessGroup ProcessGroupEngine",
    "dare_core.engines.lockstep": "collective_generation lockstep",
    "dare_core.engines.single": "SingleProcessEngine",
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'dare_core.api' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_WHERE[name]), name)
    return value


def __dir__() -> list[str]:
    return __all__
