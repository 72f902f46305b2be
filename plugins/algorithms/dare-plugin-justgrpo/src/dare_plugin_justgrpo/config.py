"""JustGRPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import copy
from typing import Any, Optional

import attrs

from dare_core.api import DareError, option, optional, positive
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


#: rollout config fields :func:`left_to_right` sets (the loader picks a backend with them)
LEFT_TO_RIGHT_FIELDS = ("gen_length", "block_length", "steps", "temperature")


def left_to_right(cfg: JustConfig, rollout_cfg: Any) -> Any:
    """``RolloutNeeds.adjust``: the training rollout config decoding one token per step, left to
    right (``block_length=1``, ``steps=gen_length``), at the algorithm's temperature (null: the
    rollout's); evaluation keeps the run's settings.

    Args:
        cfg: the algorithm config.
        rollout_cfg: the run's rollout config (a backend with :data:`LEFT_TO_RIGHT_FIELDS`).

    Returns:
        The training rollout config.
    """
    names = {f.name for f in attrs.fields(type(rollout_cfg))}
    missing = sorted(set(LEFT_TO_RIGHT_FIELDS) - names)
    if missing:
        raise DareError(
            f"justgrpo needs a rollout backend with {', '.join(sorted(LEFT_TO_RIGHT_FIELDS))} options to "
            f"decode left to right; the chosen backend lacks {', '.join(missing)} "
            f"(e.g. set rollout.backend=low_confidence)"
        )
    temp = cfg.temperature if cfg.temperature is not None else rollout_cfg.temperature
    if temp <= 0:
        raise DareError(
            "justgrpo needs a sampling temperature > 0 (exact log-probabilities "
            "of sampled tokens); set algorithm.temperature or rollout.temperature"
        )
    return attrs.evolve(rollout_cfg, block_length=1, steps=rollout_cfg.gen_length, temperature=float(temp))


# Recipe (8B masked-diffusion model): the shared group-RL recipe; the sampling temperature (0.6) is the
# algorithm's own option because the learner uses it too.
RECIPE = copy.deepcopy(GROUP_RL_RECIPE)
