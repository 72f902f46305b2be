"""d-TreeRPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

from typing import Optional

import attrs

from dare_core.api import DareError, in_range, non_negative, option, optional, positive


@attrs.frozen
class DTreeConfig:
    """d-TreeRPO options with the recipe defaults (8B math recipe)."""

    num_tree_samples: Optional[int] = option(
        None,
        "Children of the root (first branching); null = trainer.group_size / "
        "branch_factor^(contraction-1), so the leaves are the run's rollouts per prompt (the "
        "recipe: 16 leaves = 4 x 4).",
        optional(positive),
    )
    branch_factor: int = option(4, "Children of every deeper node.", positive)
    contraction: int = option(
        2,
        "Number of tree levels s: branch points T - int(k T / s), k = 0..s, over the T "
        "denoising steps (s = 2: [T, T/2, 0]). Leaves per prompt = num_tree_samples * "
        "branch_factor^(s-1).",
        positive,
    )
    clip_ratio: float = option(
        0.4, "Clip ε of the transition ratio (no dual clip).", in_range(0.0, 1.0, low_open=True, high_open=True)
    )
    kl_coef: float = option(0.01, "Weight of the k3 KL to the reference (initial) policy.", non_negative)
    self_distillation: bool = option(True, "Add the time-scheduled self-distillation term.")
    sd_lambda_max: float = option(3e-3, "λ_max of the self-distillation weight schedule.", non_negative)
    sd_gamma: float = option(2.0, "γ of λ_t = λ_max (e^{γp} - 1) / (e^γ - 1).", positive)
    sd_tau_max: float = option(2.0, "τ_max of the temperature schedule τ_t = τ_max (1 - p)^β.", positive)
    sd_beta: float = option(0.7, "β of the temperature schedule.", positive)
    sd_max_steps: int = option(30000, "Schedule length: p = clip(step / sd_max_steps, 0, 1).", positive)

    def tree_samples(self, group_size: Optional[int]) -> int:
        """Children of the root for a run with ``group_size`` rollouts per prompt."""
        below = self.branch_factor ** (self.contraction - 1)
        if self.num_tree_samples is not None:
            if group_size is not None and group_size != self.num_tree_samples * below:
                raise DareError(
                    f"dtreerpo's tree has {self.num_tree_samples * below} leaves per prompt "
                    f"(num_tree_samples x branch_factor^(contraction-1)); set "
                    f"trainer.group_size={self.num_tree_samples * below}"
                )
            return self.num_tree_samples
        if group_size is None or group_size % below:
            raise DareError(
                f"trainer.group_size ({group_size}) must be a multiple of "
                f"branch_factor^(contraction-1) = {below} (the leaves below each "
                f"child of the root); or set algorithm.num_tree_samples"
            )
        return group_size // below


#: Methods of a rollout backend the tree needs: resume partial states over a global step range,
#: and the number of global steps of a full run on given prompts.
RESUMABLE = frozenset({"continue_from", "total_steps"})


# Recipe (8B masked-diffusion model, LoRA r128 α64): lr 3e-5, wd 0.1, betas (0.9, 0.99), grad clip 0.2,
# 12 PPO epochs per rollout batch, 16 prompts x 16 leaves, rollout temperature 0.9.
RECIPE = {
    "trainer": {
        "lr": 3e-5,
        "weight_decay": 0.1,
        "beta2": 0.99,
        "grad_clip": 0.2,
        "ppo_epochs": 12,
        "batch_size": 16,
        "group_size": 16,
        "mini_batch_size": 0,
    },
    "rollout": {"temperature": 0.9},
}
