"""What the plugin registers, importable without torch: its names, options, recipe and the run
check of ``dare_configure``; the implementation is :mod:`dare_plugin_reinforce_rloo.algorithm`."""

from __future__ import annotations

import attrs

from dare_core.api import DareError, in_range, option, positive

ALGORITHM = "reinforce_rloo"
ESTIMATOR = "reinforce_rloo_seq_logprob"
LOSS = "reinforce_rloo_pg"
PAPER = "arXiv:2402.14740"


@attrs.frozen
class ReinforceRLOOConfig:
    """Options of the ``algorithm:`` section for ``--algo reinforce_rloo``."""

    mc_num: int = option(
        2,
        "Random-ratio corruption rows per sequence; the likelihood pools the masked tokens of "
        "all rows (cost: mc_num forwards per sequence and evaluation).",
        positive,
    )
    eps: float = option(
        1e-3,
        "Noise floor of the masking ratio: t = (1 - eps) u + eps with u ~ U(0, 1).",
        in_range(0.0, 1.0, high_open=True),
    )


def check_run(config) -> None:
    """Cross-section invariant checked when a run is configured (before the model loads):
    a leave-one-out baseline needs at least two samples per prompt."""
    if getattr(config, "algo", None) != ALGORITHM:
        return
    k = config.trainer.group_size
    if k < 2:
        raise DareError(
            f"algorithm {ALGORITHM!r} needs trainer.group_size >= 2 (the leave-one-out baseline "
            f"of a single sample is undefined and its advantage would be 0), got {k}; "
            f"set trainer.group_size=4"
        )


# The paper evaluates k = 2 and k = 4 samples per prompt; the default here is 4.
# On-policy REINFORCE: one optimizer step per rollout batch.
RECIPE = {
    "trainer": {"group_size": 4, "ppo_epochs": 1, "mini_batch_size": 0},
}
