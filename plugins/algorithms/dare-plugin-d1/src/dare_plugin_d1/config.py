"""d1's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from dare_core.api import in_range, non_negative, one_of, option, positive
from dare_objectives.policy_options import KL_TYPES


@attrs.frozen
class D1Config:
    """d1 options (defaults: README "Defaults" table; d1, arXiv:2504.12216)."""

    p_mask_prompt: float = option(
        0.15,
        "Probability of masking each valid prompt token in the log-prob forward.",
        in_range(0.0, 1.0, high_open=True),
    )
    remask_each_update: bool = option(
        True,
        "A new prompt masking for each inner update (PPO epoch, the paper's μ): the paper's "
        "regulariser; false = one masking per rollout batch (the DARE reference's).",
    )
    truncate_at_eos: bool = option(
        True,
        "The completion ends at its first EOS (inclusive): rewards read the truncated text and "
        "the loss counts its tokens only, as d1's code; false = every generated position counts "
        "(the DARE reference's). The forward always sees the whole masked completion.",
    )
    mc_num: int = option(1, "Corruption draws per rollout (the recipe uses 1).", positive)
    clip_ratio_low: float = option(0.2, "PPO clip ε below 1.", in_range(0.0, 1.0, high_open=True))
    clip_ratio_high: float = option(0.2, "PPO clip ε above 1.", non_negative)
    clip_ratio_c: float = option(
        3.0, "Dual-clip constant c for negative advantages (> 1).", in_range(1.0, float("inf"), low_open=True)
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        option("token-mean", "Token-loss aggregation.")
    )
    norm_adv_by_std: bool = option(True, "Divide group-centred rewards by the group std (GRPO).")
    kl_coef: float = option(
        0.0,
        "Weight β of the KL penalty to the initial policy (0 = off, as the DARE "
        "reference's recipe; the d1 paper uses 0.04).",
        non_negative,
    )
    kl_type: str = option(
        "k3",
        "KL estimator on d = ℓ - ℓ_ref: k3 = e^-d + d - 1 (the d1 paper's), k1, k2, "
        "low_var_kl (verl's clamped k3), abs; dare_log1p_* = the DARE reference's rule "
        "(raises where ℓ - ℓ_ref <= -1 and A > 0).",
        one_of(KL_TYPES),
    )


# Recipe (8 GPUs, LLaDA-8B-Instruct): 16 prompts x 8 rollouts, lr 5e-7, AdamW wd 0.01,
# one optimizer step per rollout batch, grad clip 1, rollout temperature 0.6.
RECIPE = {
    "trainer": {
        "lr": 5e-7,
        "weight_decay": 0.01,
        "batch_size": 16,
        "group_size": 8,
        "ppo_epochs": 1,
        "mini_batch_size": 0,
        "grad_clip": 1.0,
    },
    "rollout": {"temperature": 0.6},
}


def eos_truncation(cfg: D1Config, rollout_cfg: Any) -> Any:
    """``RolloutNeeds.adjust``: the training rollout config with ``truncate_at_eos`` from the
    algorithm (the response mask, and so the decoded text the rewards read, ends at the first
    EOS); evaluation keeps the run's.

    Args:
        cfg: the algorithm config.
        rollout_cfg: the run's rollout config (a backend with a ``truncate_at_eos`` option).

    Returns:
        The training rollout config.
    """
    return attrs.evolve(rollout_cfg, truncate_at_eos=cfg.truncate_at_eos)
