"""Run one training job: resolve → set up → the algorithm's workflow → summary."""

from __future__ import annotations

import time
from typing import Any, Optional

from dare_core.config import RunConfig
from dare_core.errors import DareError
from dare_core.rundir import RunDir
from dare_core.workflows.runtime import setup


def train(dare: Any, config: RunConfig, *, rundir: Optional[RunDir] = None) -> dict[str, Any]:
    """Train with ``config``; returns the summary (also written to ``summary.json``)."""
    spec = dare.registries.algorithms.get(config.algo)
    if spec.workflow not in dare.registries.workflows:
        raise DareError(f"algorithm {spec.name!r} needs the {spec.workflow!r} workflow; "
                        + dare.registries.workflows.unknown_message(spec.workflow))
    workflow = dare.registries.workflows.get(spec.workflow).run
    start = time.time()
    dare.pm.hook.dare_configure.call_historic(kwargs={"config": config})
    try:
        if rundir is None:  # after dare_configure, so a refused run leaves no directory
            rundir = RunDir.create(config.output_dir, config.run_name,
                                   f"{config.algo}-{config.model.family}")
        ctx = setup(dare, config, rundir=rundir)
        if ctx.engine.is_main:
            dare.pm.hook.dare_on_run_start(config=config, run_dir=rundir.root)
        ctx.log(f"run directory: {rundir.root}")
        result = workflow(ctx)
    finally:
        dare.pm.hook.dare_unconfigure(config=config)
    summary = {
        "algo": config.algo,
        "model": config.model.family,
        "checkpoint": config.model.path,
        "task": config.task.name,
        "seed": config.seed,
        "eval": result.get("eval", {}),
        "train": result.get("train", {}),
        "final_checkpoint": result.get("final_checkpoint"),
        "seconds": round(time.time() - start, 1),
        "run_dir": rundir.root,
    }
    rundir.write_json("summary.json", summary)
    return summary
