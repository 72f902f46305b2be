"""A test plugin for the divergence test on two ranks: the supervised digits algorithm
``sup_nan``, whose loss is NaN on rank 1 only (a constant added, so every gradient stays finite
and the update goes through); imported by name in the spawned ranks (this directory is put on
``sys.path``)."""

from __future__ import annotations

import os
from typing import Any, Optional

from dare_core.errors import DivergenceError
from dare_core.interfaces import AlgorithmSpec
from dare_core.plugins import hookimpl
from dare_core.testing.digits import ClipConfig, masked_nll, sup_components
from dare_core.testing.engines import train_run


class NanOnRank1:
    totals = staticmethod(masked_nll.totals)

    def __call__(self, logp: Any, corrupted: Any, batch: Any, *, totals: Optional[dict] = None):
        loss, metrics = masked_nll(logp, corrupted, batch, totals=totals)
        return (loss + float("nan") if os.environ.get("RANK") == "1" else loss), metrics


nan_on_rank_1 = NanOnRank1()


class NanOnRank:
    @hookimpl
    def dare_register_algorithms(self, register):
        def build(cfg: Any, lookup: Any):
            comps = sup_components(cfg, lookup)
            return type(comps)(corruption=comps.corruption, estimator=comps.estimator, loss=nan_on_rank_1)

        register(AlgorithmSpec("sup_nan", "sft", ClipConfig, build))


def train_until_diverged(overrides: list[str]) -> Optional[str]:
    """This rank's :class:`DivergenceError` message (``None``: the run finished)."""
    try:
        train_run(("nan_on_rank:NanOnRank",), "sup_nan", overrides)
    except DivergenceError as exc:
        return str(exc)
    return None
