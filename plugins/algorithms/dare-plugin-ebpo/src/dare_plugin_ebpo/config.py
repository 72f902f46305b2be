"""EBPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import attrs

from dare_core.api import divides, in_range, non_negative, one_of, option, positive
from dare_objectives.policy_options import GROUP_RL_RECIPE


@attrs.frozen
class EBPOConfig:
    """EBPO options with the recipe defaults (mc_num = n_l = 16)."""

    mc_num: int = option(16, "Monte-Carlo corruption rows per sequence.", positive)
    n_l: int = option(
        16,
        "Rows per stratification group: the group's (row, block) cells share one "
        "uniform u with levels (u + c/N_cells) mod 1; must divide mc_num.",
        divides("mc_num"),
    )
    block_length: int = option(
        0,
        "Block size of the composite ELBO; 0 = the model's block size (must equal the rollout's block length).",
        non_negative,
    )
    clip_ratio_low: float = option(0.2, "Sequence-ratio clip ε below 1.", in_range(0.0, 1.0, high_open=True))
    clip_ratio_high: float = option(0.2, "Sequence-ratio clip ε above 1.", non_negative)
    kl_coef: float = option(
        0.0, "Weight of the sequence KL to the initial policy (0 = off, as the recipes).", non_negative
    )
    kl_type: str = option(
        "k3", "Sequence KL form on composite ELBOs: k1, abs, k2, k3.", one_of(("k1", "abs", "k2", "k3"))
    )
    norm_adv_by_std: bool = option(True, "Divide group-centred rewards by the group std (GRPO).")


# Recipe (block-diffusion 8B, 8 GPUs): the shared group-RL trainer settings (16 prompts x 8 rollouts,
# lr 5e-7, one optimizer step per rollout batch); the rollout temperature is the family's (1.0 / 0.6).
RECIPE = {"trainer": dict(GROUP_RL_RECIPE["trainer"])}
