"""ESPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import attrs

from dare_core.api import in_range, non_negative, one_of, option, positive


@attrs.frozen
class ESPOConfig:
    """ESPO options with the recipe defaults (sudoku recipe: ε 0.2, KL k2 β = 1e-2)."""

    mc_num: int = option(2, "Monte-Carlo mask sets per sequence (each with its complement).", positive)
    clip_ratio: float = option(
        0.2, "Sequence-ratio clip ε (symmetric; the countdown recipe uses 0).", in_range(0.0, 1.0, high_open=True)
    )
    kl_coef: float = option(
        1e-2,
        "Weight β of the sequence KL to the initial policy (recipes: 1e-3 math, "
        "1e-2 code and sudoku, 3e-3 countdown; 0 = off, no reference model).",
        non_negative,
    )
    kl_type: str = option(
        "k2",
        "KL form on raw ELBOs, divided by R: k1 (with the gradient-correction term), k2 (Δ²/2), k3 (e^-Δ + Δ - 1).",
        one_of(("k1", "k2", "k3")),
    )


# Recipe (LLaDA-8B-Instruct): RLOO, lr 5e-7, rollout temperature 1.0, 6 rollouts per prompt
# (sudoku/countdown; 16 for math), num_iterations 8 -> 8 optimizer steps per rollout batch.
RECIPE = {
    "trainer": {
        "lr": 5e-7,
        "weight_decay": 0.01,
        "batch_size": 16,
        "group_size": 6,
        "ppo_epochs": 8,
        "mini_batch_size": 0,
        "grad_clip": 1.0,
    },
    "rollout": {"temperature": 1.0},
}
