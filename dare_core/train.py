"""Run one training job: resolve → engine → run directory (or the one resumed) → set up → the
algorithm's workflow → summary."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

import yaml

from dare_core.config import RunConfig, to_dict
from dare_core.engines import build_engine
from dare_core.errors import DareError
from dare_core.rundir import RunDir
from dare_core.workflows.checkpoint import check_compatible, find_resume
from dare_core.workflows.runtime import setup


def _run_dir(config: RunConfig, engine: Any, log: Any) -> tuple[RunDir, Optional[str]]:
    """The run directory (rank 0 claims it; every rank gets its path) and the checkpoint the run
    resumes from (``trainer.resume``), after checking the checkpoint's run config."""
    resume = config.trainer.resume
    if resume == "auto" and not config.run_name:
        raise DareError("trainer.resume=auto continues the run named by run_name; set run_name=<the run>")
    root = (os.path.dirname(os.path.dirname(os.path.abspath(resume))) if resume and resume != "auto"
            else os.path.join(config.output_dir, config.run_name or ""))
    path = find_resume(config, root, log) if engine.is_main else None
    path = engine.gather([path])[0]
    if path is not None:
        with open(os.path.join(root, "config.yaml")) as fh:
            check_compatible(yaml.safe_load(fh), to_dict(config), path)
        if os.path.isfile(os.path.join(root, "summary.json")):
            raise DareError(f"trainer.resume: run {root} has finished (summary.json); start a new run "
                            f"with model.path={os.path.join(root, 'final')} to train further")
        return RunDir(root), path
    created = None
    if engine.is_main:
        created = RunDir.create(config.output_dir, config.run_name, f"{config.algo}-{config.model.family}")
        if resume:  # nothing to resume: a fresh run, without the records of one killed earlier
            created.truncate_metrics(0)
        created = created.root
    return RunDir(engine.gather([created])[0]), None


def train(dare: Any, config: RunConfig, *, rundir: Optional[RunDir] = None) -> dict[str, Any]:
    """Train with ``config``; returns the summary (also written to ``summary.json``)."""
    spec = dare.registries.algorithms.get(config.algo)
    if spec.workflow not in dare.registries.workflows:
        raise DareError(f"algorithm {spec.name!r} needs the {spec.workflow!r} workflow; "
                        + dare.registries.workflows.unknown_message(spec.workflow))
    workflow = dare.registries.workflows.get(spec.workflow).run
    start = time.time()
    dare.pm.hook.dare_configure.call_historic(kwargs={"config": config})
    engine = None
    try:
        engine = build_engine(dare, config)
        tr = config.trainer
        for key, value in (("batch_size", tr.batch_size), ("mini_batch_size", tr.mini_batch_size)):
            if value % engine.world_size:
                raise DareError(f"trainer.{key}={value} cannot be split over {engine.world_size} processes; "
                                f"make it a multiple of the world size")
        resume_from = None
        if rundir is None:  # after dare_configure, so a refused run leaves no directory
            rundir, resume_from = _run_dir(config, engine, lambda m: print(m, file=sys.stderr, flush=True))
        ctx = setup(dare, config, rundir=rundir, engine=engine, resume_from=resume_from)
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
        "world_size": engine.world_size,
        "eval": result.get("eval", {}),
        "train": result.get("train", {}),
        "final_checkpoint": result.get("final_checkpoint"),
        "seconds": round(time.time() - start, 1),
        "run_dir": rundir.root,
    }
    if engine.is_main:
        rundir.write_json("summary.json", summary)
    engine.barrier()
    engine.close()
    return summary
