"""CJ-GRPO (Yang et al. 2025, "Taming Masked Diffusion Language Models via Consistency Trajectory
Reinforcement Learning with Fewer Decoding Step", arXiv:2509.23924).

Instead of a one-step or ELBO surrogate, the rollout records the step at which every token was
committed and the PPO objective is optimised on every intermediate transition ``x_k → x_{k+1}``
actually taken, so the optimised trajectory is the decoding trajectory.

Everything here is composed from core components:

* trajectory ``step_replay`` — the states before each recorded step, built once per rollout batch
  (no random corruption, so old, reference and new log-probabilities see the same states);
* estimator ``response_token_logprob`` — ``log p_θ(y_j | state_k)`` for every response token (the
  model wrapper hides logit shifts and, for block models, the ``[noisy | clean]`` layout);
* loss ``replay_clipped_pg`` — the clipped surrogate with the reduction of the paper path that fits
  the model kind (masked: local-step mean over global steps; block: per-sample transition mean,
  paper Eq. 11), one forward and backward per chunk of steps.
"""

from __future__ import annotations

import copy
from typing import Literal

import attrs

from dare_core.api import RLComponents, option, positive
from dare_objectives.policy_options import (
    GROUP_RL_RECIPE,
    ClipOptions,
    advantage_from_options,
    clip_kwargs,
)


@attrs.frozen
class CJConfig(ClipOptions):
    """CJ-GRPO options with the recipe defaults."""

    reduction: Literal["auto", "step_mean", "per_sample", "token_mean"] = option(
        "auto",
        "How the per-step losses are combined: auto = step_mean for masked-diffusion models "
        "(the reference MDLM path: (1/K) Σ_k token-mean of step k) and per_sample for block "
        "models (paper Eq. 11: mean over samples of the mean over their (block, local step) "
        "transitions of the mean token loss).",
    )
    row_chunk: int = option(
        1, "Replayed steps per forward/backward (memory grows with it; the loss does not change).", positive
    )


def build(cfg: CJConfig, lookup) -> RLComponents:
    loss = lookup.loss(kl_coef=cfg.kl_coef, kl_type=cfg.kl_type, row_chunk=cfg.row_chunk, **clip_kwargs(cfg))
    return RLComponents(
        trajectory=lookup.trajectory(reduction=cfg.reduction),
        estimator=lookup.estimator(),
        loss=loss,
        accumulate=loss,
        advantage=advantage_from_options(cfg, lookup),
        needs_ref=cfg.kl_coef > 0,
    )


# Recipe (8B masked-diffusion model, 8 GPUs): the shared group-RL recipe (temperature 0.6; R = 256 and
# 128 steps on math, block 32 — rollout lengths are the task's / checkpoint's settings).
RECIPE = copy.deepcopy(GROUP_RL_RECIPE)
