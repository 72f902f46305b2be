"""Coupled-GRPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import copy
from typing import Literal

import attrs

from dare_core.api import in_range, option
from dare_objectives.policy_options import GROUP_RL_RECIPE, ClippedObjectiveOptions


def _ratio_bounds(inst: "CoupledConfig", attr, value) -> None:
    if not inst.t_low < inst.t_high:
        raise ValueError(f"t_low ({inst.t_low}) must be < t_high ({inst.t_high})")


@attrs.frozen
class CoupledConfig(ClippedObjectiveOptions):
    """Coupled-GRPO options (defaults: README "Defaults" table; DiffuCoder, arXiv:2506.20639)."""

    t_low: float = option(
        0.2, "Lower bound of the mask ratio t ~ U(t_low, t_high).", in_range(0.0, 1.0, low_open=True, high_open=True)
    )
    t_high: float = option(
        0.8,
        "Upper bound of the mask ratio t (must exceed t_low).",
        [in_range(0.0, 1.0, low_open=True, high_open=True), _ratio_bounds],
    )
    seed_mode: Literal["fixed", "stream"] = option(
        "stream",
        "'stream' = fresh masks every step, as DiffuCoder's code (random_masking): t per sequence and "
        "the per-token uniforms come from the run's generator. 'fixed' = the DARE reference's: every "
        "draw uses a private generator re-seeded with `seed`, so t (0.5836560790747303 for 42 on "
        "(0.2, 0.8)) and the random matrix are the same for every sequence and step for the whole "
        "run; the run's random streams are NOT reset.",
    )
    seed: int = option(42, "Seed of the private generator in seed_mode=fixed.")


# Recipe (8B masked-diffusion model, 8 GPUs): the shared group-RL recipe, as d1.
RECIPE = copy.deepcopy(GROUP_RL_RECIPE)
