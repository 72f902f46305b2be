"""BGPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import attrs

from dare_core.api import divides, one_of, option, positive
from dare_objectives.policy_options import GROUP_RL_RECIPE, ClippedObjectiveOptions


@attrs.frozen
class BGPOConfig(ClippedObjectiveOptions):
    """BGPO options with the recipe defaults (LLaDA math recipe: mc_num = n_l = 16; clip, advantage
    and KL options shared with the other clipped objectives)."""

    mc_num: int = option(16, "Monte-Carlo corruption rows per sequence (ELBO samples).", positive)
    n_l: int = option(
        16,
        "Rows per stratified group: each group draws k ~ U{1..L} and spreads its "
        "n_l mask counts evenly over 1..L; must divide mc_num.",
        divides("mc_num"),
    )
    length_norm: str = option(
        "auto",
        "ELBO normaliser: padded (R), valid (#valid response tokens), none, or auto = padded "
        "for masked-diffusion wrappers and valid for block wrappers (the reference's choice).",
        one_of(("auto", "padded", "valid", "none")),
    )
    nan_guard: bool = option(
        True,
        "Compute the A>0 ratio as 1 + Δ directly. The reference evaluates exp(log(1 + Δ)), "
        "which is NaN for Δ <= -1 and makes the optimizer skip the whole step; with the guard "
        "such rows keep the linear surrogate -A(1 + Δ) (finite, gradient -A∇ℓ like every "
        "unclipped A>0 row). Counted as ratio_nonpositive either way.",
    )
    accumulate: bool = option(
        True,
        "Backward after every Monte-Carlo row (memory independent of mc_num); false keeps "
        "every row's graph until one backward (same gradient, memory grows with mc_num).",
    )


# Recipe (8 GPUs, LLaDA-8B-Instruct): the shared group-RL recipe (16 prompts x 8 rollouts, lr 5e-7,
# one optimizer step per rollout batch, rollout temperature 0.6).
RECIPE = GROUP_RL_RECIPE
