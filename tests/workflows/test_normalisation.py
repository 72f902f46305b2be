"""One normalisation over the global mini-batch: the RL loop's gradient does not depend on
``trainer.micro_batch_size`` or the world size, for every ``agg_loss`` mode of the core's clipped
policy loss and for an SFT objective (token counts, row counts and cells of the whole mini-batch, summed over its
micro-batches and ranks before the backward, as DAPO arXiv:2503.14476 does), and a loss that
cannot say what it divides by is refused before any work."""

import os
import sys

import attrs
import pytest

from dare_core.components.estimators import ResponseTokenLogProb
from dare_core.components.losses import ClippedPolicyLoss
from dare_core.config import option
from dare_core.errors import DareError
from dare_core.interfaces import AlgorithmSpec, RLComponents, SFTComponents
from dare_core.plugins import hookimpl
from dare_core.testing.algorithm_checks import check_partition_invariance
from dare_core.testing.digits import DigitsPlugin
from dare_core.testing.registries import build_for
from dare_core.workflows.runtime import build_components

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # the spawned ranks import AggPlugin


@attrs.frozen
class AggConfig:
    loss_agg_mode: str = option("token-mean", "Token-loss aggregation.")


def build(cfg, lookup):
    return RLComponents(
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

    estimator = ResponseTokenLogProb()
    RLComponents(estimator=estimator, loss=ClippedPolicyLoss()).check("ok")
    with pytest.raises(DareError, match="OldLoss of algorithm 'old' lacks a member of the PolicyLoss seam"):
        RLComponents(estimator=estimator, loss=OldLoss()).check("old")
    with pytest.raises(DareError, match="SFTObjective"):
        SFTComponents(estimator=estimator, loss=lambda logp, corrupted, batch: (logp.sum(), {})).check("sup")


def test_a_build_returning_another_workflows_bundle_is_refused():
    """An algorithm of the ``sft`` workflow whose build returns an RL bundle is refused in one line
    naming both bundles (config resolution, before the model loads)."""
    dare = build_for(DigitsPlugin(rl_name=None), AggPlugin())
    spec = attrs.evolve(dare.registries.algorithms.get("agg_test"), workflow="sft")
    with pytest.raises(DareError, match="build returned RLComponents, but its workflow 'sft' runs on SFTComponents"):
        build_components(dare, spec, AggConfig())
    built = build_components(dare, dare.registries.algorithms.get("agg_test"), AggConfig())
    assert isinstance(built, RLComponents) and built.trajectory is not None and built.advantage is not None
