"""MDPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import copy

import attrs

from dare_core.api import in_range, non_negative, option, positive
from dare_objectives.policy_options import GROUP_RL_RECIPE


@attrs.frozen
class MDPOConfig:
    """MDPO options with the recipe defaults (8B math recipe)."""

    sample_train_steps: int = option(
        16,
        "Denoising steps trained per rollout batch: the steps with the largest Σ_b |A_bk| "
        "(the same steps for every row).",
        positive,
    )
    epsilon: float = option(
        0.2, "Clip ε of the ratio (symmetric, no dual clip).", in_range(0.0, 1.0, low_open=True, high_open=True)
    )
    norm_adv_by_std: bool = option(True, "Divide the group-centred step scores by the group std.")
    kl_coef: float = option(0.0, "β of the (ℓ_ref − ℓ)²/2 penalty (recipe: off; 0.02 listed but unused).", non_negative)
    count_after_eos: bool = option(
        False,
        "Also train masked positions after the final response's first EOS (the reference "
        "counts them in the completion mask although they are padding of the final response); "
        "false = only positions of the final response.",
    )


#: what :class:`~dare_plugin_mdpo.algorithm.StepStateRows` needs the rollout to record
RECORDS = frozenset({"step_states"})


# Recipe (8B masked-diffusion model): the shared group-RL recipe (T = 0.6, no cache, block 32, steps R/2).
RECIPE = copy.deepcopy(GROUP_RL_RECIPE)
