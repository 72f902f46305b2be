"""Run one training job: resolve → engine → the checks before any work (:mod:`dare_core.preflight`)
→ the run directory (claimed, or the one resumed) → set up → the algorithm's workflow → summary."""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import yaml

from dare_core.config import RunConfig, to_dict
from dare_core.console import info
from dare_core.engines import build_engine
from dare_core.errors import DareError
from dare_core.preflight import preflight
from dare_core.rundir import RunDir
from dare_core.workflows.checkpoint import check_compatible, find_resume
from dare_core.workflows.runtime import setup

if TYPE_CHECKING:
    from dare_core.plugins import Dare


def _agree(engine: Any, fn: Callable[[], Any], main_only: bool = False) -> Any:
    """``fn()`` on every rank (``main_only``: on rank 0, its result to all); a DareError on any is raised on all."""
    out: tuple[Any, Optional[DareError]]
    try:
        out = (fn() if engine.is_main or not main_only else None, None)
    except DareError as exc:
        out = (None, exc)
    gathered = engine.gather([(out[0] if main_only else None, out[1] and str(out[1]))])
    if failed := [message for _, message in gathered if message]:
        raise out[1] or DareError(failed[0])
    return gathered[0][0] if main_only else out[0]


def _claim(config: RunConfig, overwrite: bool, log: Any) -> tuple[str, Optional[str], bool]:
    """Rank 0: ``(run directory, checkpoint to resume from, whether the directory is new)``; a run
    continued with ``trainer.resume`` loses the temp entries of an interrupted save."""
    resume, name = config.trainer.resume, config.run_name
    if resume and overwrite:
        raise DareError("--overwrite replaces a run and trainer.resume continues one; pass one of them")
    if resume == "auto" and not name:
        raise DareError("trainer.resume=auto continues the run named by run_name; set run_name=<the run>")
    root = (
        os.path.dirname(os.path.dirname(os.path.abspath(resume)))
        if resume and resume != "auto"
        else os.path.join(config.output_dir, name or "")
    )
    path = find_resume(config, root, log)
    if resume and os.path.isfile(os.path.join(root, "summary.json")):
        raise DareError(
            f"trainer.resume: run {root} has finished (summary.json); start a new run "
            f"with model.path={os.path.join(root, 'final')} to train further"
        )
    if path is None and not (resume and os.path.isdir(root)):
        return (
            RunDir.create(config.output_dir, name, f"{config.algo}-{config.model.family}", overwrite=overwrite).root,
            None,
            True,
        )
    if path is not None:
        with open(os.path.join(root, "config.yaml")) as fh:
            check_compatible(yaml.safe_load(fh), to_dict(config), path)
    (run := RunDir(root)).remove_temp()
    if path is None:  # nothing to resume: a fresh run, without the records of one killed earlier
        run.truncate_metrics(0)
    return root, path, False


def _check_batches(config: RunConfig, world_size: int) -> None:
    """Refuse a global batch or mini-batch the processes cannot share evenly."""
    tr = config.trainer
    for key, value in (("batch_size", tr.batch_size), ("mini_batch_size", tr.mini_batch_size)):
        if value % world_size:
            raise DareError(
                f"trainer.{key}={value} cannot be split over {world_size} processes; "
                f"make it a multiple of the world size"
            )


def train(dare: Dare, config: RunConfig, *, rundir: Optional[RunDir] = None, overwrite: bool = False) -> dict[str, Any]:
    """Train with ``config``; returns the summary (also written to ``summary.json``).
    ``overwrite``: replace the run directory ``run_name`` names (``dare train --overwrite``)."""
    spec = dare.registries.algorithms.get(config.algo)
    if spec.workflow not in dare.registries.workflows:
        raise DareError(
            f"algorithm {spec.name!r} needs the {spec.workflow!r} workflow; "
            + dare.registries.workflows.unknown_message(spec.workflow)
        )
    workflow = dare.registries.workflows.get(spec.workflow).run
    start = time.time()
    dare.pm.hook.dare_configure.call_historic(kwargs={"config": config})
    engine = None
    try:
        engine = build_engine(dare, config)
        _check_batches(config, engine.world_size)
        task = _agree(engine, lambda: preflight(dare, config, train=True))
        resume_from, fresh = None, False
        if rundir is None:  # after the checks, so a refused run leaves no directory
            root, resume_from, fresh = _agree(
                engine,
                lambda: _claim(config, overwrite, info),
                main_only=True,
            )
            rundir = RunDir(root)
        try:
            ctx = setup(dare, config, rundir=rundir, engine=engine, resume_from=resume_from, task=task)
        except BaseException:
            if fresh and engine.is_main:  # a run that fails before its first step leaves no directory
                shutil.rmtree(rundir.root, ignore_errors=True)
            raise
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
