"""The public API of dare-core for plugin authors: what a family, algorithm, rollout backend, task,
command or observer plugin may import (the seams, generic components, config, errors, model
wrappers, training paths, the runtime commands drive). Other ``dare_core`` modules are private;
the testing kit is :mod:`dare_core.testing`."""

from dare_core.components import ComponentLookup, corrupted_logprobs
from dare_core.components.advantages import GroupNormAdvantage, RLOOAdvantage
from dare_core.components.corruptions import RandomRatioMasking, mask_tokens
from dare_core.components.estimators import MaskedTokenLogProb, ResponseTokenLogProb
from dare_core.components.losses import ClippedPolicyLoss, agg_loss, kl_penalty, masked_mean
from dare_core.components.trajectories import FinalSequence
from dare_core.config import RunConfig, TaskConfig, option, resolve, structure, to_dict
from dare_core.config.loader import misfit, parse_overrides
from dare_core.config.validators import divides, in_range, non_negative, one_of, optional, positive, probability
from dare_core.errors import CapabilityError, ConfigError, DareError
from dare_core.interfaces import *  # noqa: F401,F403 (the seams; see dare_core.interfaces.__all__)
from dare_core.interfaces import __all__ as _seams
from dare_core.models.base import HFDiffusionWrapper, gather_logprobs
from dare_core.ops.attention import FLEX_BLOCK, HALF, DocumentMask, available_kernels, cu_seqlens, document_mask
from dare_core.ops.fused_ce import DEFAULT_CHUNK_ELEMENTS, chunk_rows, fused_token_logprobs, naive_token_logprobs
from dare_core.ops.packing import plan_packing
from dare_core.ops.paths import configure_training_paths, param_dtype, select_training_paths
from dare_core.pairing import compare, describe, paired_counts
from dare_core.plugins import get_dare, hookimpl
from dare_core.rng import for_device
from dare_core.rundir import atomic_write_file, atomic_write_text
from dare_core.workflows.batching import decode_responses, left_pad
from dare_core.workflows.evaluation import evaluate
from dare_core.workflows.runtime import eval_backend_name, eval_context, eval_rollout_config, setup
from dare_core.workflows.sft import default_collate

# --- what workflows in plugins use (dare-plugin-preference): the run context and its tracker,
# the batch stream and its random streams, rollout and batching helpers, the learning-rate
# schedule, the reference policy
from dare_core.engines.common import lr_at
from dare_core.workflows.batching import STREAM_CORRUPTION, STREAM_DATA, BatchStream, chunks, encode_prompts
from dare_core.workflows.rl import ReferencePolicy, estimate_no_grad
from dare_core.workflows.runtime import Context, build_rollout
from dare_core.workflows.tracker import Tracker

# --- what engine plugins build on: the single-process engine, the process-group base and the
# shared precision / optimizer pieces
from dare_core.engines.common import (CompensatedAdamW, adamw, autocast_for, cast_for_precision, grad_norm,
                                      resolve_precision, set_lr, trainable_parameters)
from dare_core.engines.distributed import LAUNCH_HINT, ProcessGroupEngine
from dare_core.engines.single import SingleProcessEngine

__all__ = sorted(set(_seams) | {name for name in dir() if not name.startswith("_")} - {"annotations"})
