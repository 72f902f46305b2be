"""JustGRPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import copy
from typing import Optional

import attrs

from dare_core.api import option, optional, positive
from dare_objectives.policy_options import GROUP_RL_RECIPE, ClipOptions


@attrs.frozen
class JustConfig(ClipOptions):
    """JustGRPO options with the recipe defaults."""

    temperature: Optional[float] = option(
        0.6,
        "Sampling temperature of the training rollout and of the learner's log-probabilities "
        "(must be > 0); null = rollout.temperature.",
        optional(positive),
    )
    row_chunk: int = option(
        1, "Response positions per forward/backward (the reference's position chunk size).", positive
    )
    exclude_mask_token: bool = option(
        True,
        "Renormalise the learner's softmax without the mask token, which the core samplers "
        "never propose, so ℓ is exactly the sampling log-probability (false = the reference's "
        "full softmax).",
    )


#: rollout config fields :func:`left_to_right_rollout` sets (the loader picks a backend with them)
LEFT_TO_RIGHT_FIELDS = ("gen_length", "block_length", "steps", "temperature")


# Recipe (8B masked-diffusion model): the shared group-RL recipe; the sampling temperature (0.6) is the
# algorithm's own option because the learner uses it too.
RECIPE = copy.deepcopy(GROUP_RL_RECIPE)
