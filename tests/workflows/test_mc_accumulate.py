"""The RL loop hands Monte-Carlo accumulation to a loss that has ``accumulate`` (one row at a
time), with the same first-update ratio and a finite update; losses without it are untouched."""

import attrs
import pytest
import torch

import dare_objectives  # the shared ELBO estimator and stratified masking
import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core.config import option
from dare_core.interfaces import AlgorithmSpec, RLComponents
from dare_core.plugins import hookimpl
from dare_core.testing import toy
from dare_core.testing.algorithm_checks import one_rl_step
from dare_objectives.elbo import RowMeanObjective, clipped_surrogate


class SeqPPO(RowMeanObjective):
    calls: list = []

    def objective(self, elbo, rows, old_rows, ref_rows, advantages, mask, *, totals):
        ratio = torch.exp((elbo - old_rows.mean(0)) / mask.shape[-1])
        loss, _, _ = clipped_surrogate(ratio, advantages, 0.2, 0.2)
        return loss.sum() / totals["rows"].to(loss.dtype), {"ratio_mean": float(ratio.detach().mean())}

    def accumulate(self, estimate, num_rows, *args, **kwargs):
        rows_seen = []

        def spy(rows):
            rows_seen.append(list(rows))
            return estimate(rows)

        out = super().accumulate(spy, num_rows, *args, **kwargs)
        SeqPPO.calls.append(rows_seen)
        return out


@attrs.frozen
class Cfg:
    mc_num: int = option(3, "rows")


class Plugin:
    @hookimpl
    def dare_register_algorithms(self, register):
        def build(cfg, lookup):
            return RLComponents(
                corruption=lookup.corruption("stratified_count_masking", mc_num=cfg.mc_num, n_l=cfg.mc_num),
                trajectory=lookup.trajectory("final_sequence"),
                estimator=lookup.estimator("sequence_elbo", norm="none"),
                loss=(loss := SeqPPO()),
                accumulate=loss,
                advantage=lookup.advantage("group_norm"),
            )

        register(AlgorithmSpec("mc_seq_test", "rl", Cfg, build, recipe={"trainer": {"lr": 1e-3}}))


def test_loop_uses_accumulate_one_row_at_a_time(tmp_path):
    SeqPPO.calls.clear()
    rec = one_rl_step(
        (dare_objectives, dare_plugin_samplers, dare_plugin_tasks, toy, Plugin()), "mc_seq_test", "toy", tmp_path
    )
    assert rec["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert rec["grad_norm"] > 0 and rec["skipped_steps"] == 0
    # 8 sequences in micro-batches of 4: all rows once without grad, then each row alone
    assert SeqPPO.calls == [[[0, 1, 2], [0], [1], [2]]] * 2  # 2 micro-batches of 4
