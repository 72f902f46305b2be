"""One normalisation over the global mini-batch: the RL loop's gradient does not depend on
``trainer.micro_batch_size`` or the world size, for every ``agg_loss`` mode of the core's clipped
policy loss and for an SFT objective (token counts, row counts and cells of the whole mini-batch, summed over its
micro-batches and ranks before the backward, as DAPO arXiv:2503.14476 does), and a loss that
cannot say what it divides by is refused before any work."""

import os
import sys

import attrs
import pytest

from dare_core.components.losses import ClippedPolicyLoss
from dare_core.config import option
from dare_core.errors import DareError
from dare_core.interfaces import AlgorithmSpec, Components, PolicyLoss, SFTObjective
from dare_core.plugins import hookimpl
from dare_core.testing.algorithm_checks import check_partition_invariance
from dare_core.testing.digits import DigitsPlugin
from dare_core.workflows.rl import require_totals

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # the spawned ranks import AggPlugin


@attrs.frozen
class AggConfig:
    loss_agg_mode: str = option("token-mean", "Token-loss aggregation.")


def build(cfg, lookup):
    return Components(
        corruption=lookup.corruption("random_ratio", mc_num=2),
        trajectory=lookup.trajectory("final_sequence"),
        estimator=lookup.estimator("response_token_logprob"),
        loss=lookup.loss("clipped_pg", agg=cfg.loss_agg_mode),
        advantage=lookup.advantage("group_norm"),
    )


class AggPlugin:
    """The core's clipped policy loss as the algorithm ``agg_test`` (picklable for the ranks)."""

    @hookimpl
    def dare_register_algorithms(self, register):
        register(AlgorithmSpec("agg_test", "rl", AggConfig, build))


def test_clipped_loss_gradient_is_the_same_for_every_partition_and_agg_mode():
    """Micro-batches of 1, 2, all 4 rows and 2 gloo ranks (rows of lengths 8, 5, 2, 7; fp64)
    give the same gradient within 1e-6 for token-mean, seq-mean-token-sum, seq-mean-token-mean
    and seq-mean-token-sum-norm."""
    check_partition_invariance([AggPlugin()], "agg_test")


def test_sft_objective_gradient_is_the_same_for_every_partition():
    """The SFT loop's objective over totals of the whole batch (the digits test objective, a
    masked NLL over the batch's response tokens), corruption drawn once over the batch."""
    check_partition_invariance([DigitsPlugin(rl_name=None)], "sup_test")


def test_a_loss_without_totals_is_refused_before_any_work():
    class OldLoss:  # written before the seam had ``totals``
        def __call__(self, logp, old_logp, ref_logp, advantages, mask, *, extras=None):
            return logp.sum(), {}

    require_totals(ClippedPolicyLoss(), PolicyLoss, "ok")
    with pytest.raises(DareError, match="OldLoss of algorithm 'old' has no method 'totals'"):
        require_totals(OldLoss(), PolicyLoss, "old")
    with pytest.raises(DareError, match="SFTObjective"):
        require_totals(lambda logp, corrupted, batch: (logp.sum(), {}), SFTObjective, "sup")
