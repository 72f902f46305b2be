"""SPG's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

from typing import Optional

import attrs

from dare_core.api import in_range, one_of, option, optional, positive, probability
from dare_objectives.policy_options import GROUP_RL_RECIPE


def _not_below_min_t(inst, attr, value) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0 or value < inst.min_t:
        raise ValueError(f"{attr.name} must be in [min_t={inst.min_t}, 1], got {value!r}")


@attrs.frozen
class SPGConfig:
    """SPG options with the recipe defaults (LLaDA math recipe)."""

    mc_num: int = option(1, "Corruption rows per sequence (num_t; the recipe uses 1).", positive)
    block_length: Optional[int] = option(
        None,
        "Block size of the block-wise masking; null = the training rollout's semi-AR block "
        "(rollout.block_length), or 32 when the rollout has no blocks. A response length "
        "that is not a multiple gets a shorter last block.",
        optional(positive),
    )
    p_mask_prompt: float = option(
        0.15,
        "Masking probability of valid tokens before the chosen block (prompt and earlier response blocks).",
        in_range(0.0, 1.0, high_open=True),
    )
    min_t: float = option(0.0, "Lower end of the masked fraction k/m inside the chosen block.", probability)
    max_t: float = option(1.0, "Upper end of the masked fraction inside the chosen block (>= min_t).", _not_below_min_t)
    logp_estimation: str = option(
        "mix",
        "Bound used for non-positive advantages: mix (w·EUBO + (1-w)·ELBO), eubo, elbo, zero.",
        one_of(("mix", "eubo", "elbo", "zero")),
    )
    eubo_beta: float = option(1.5, "Rényi exponent β of the upper bound (>= 1).", in_range(1.0, float("inf")))
    mix_weight: float = option(0.5, "Weight w of the EUBO in the mix.", probability)
    norm_adv_by_std: bool = option(True, "Divide group-centred rewards by the group std (GRPO).")


# Recipe (8 GPUs, LLaDA-8B-Instruct): the shared group-RL recipe (16 prompts x 8 rollouts, lr 5e-7,
# one optimizer step per rollout batch, rollout temperature 0.6); block 32.
RECIPE = GROUP_RL_RECIPE
