"""A test plugin that kills a run (SIGKILL) where ``DARE_TEST_KILL_AT`` says, for the resume
tests (imported by name in the spawned ranks: this directory is put on ``sys.path``)."""

from __future__ import annotations

import os
from typing import Any

from dare_core.plugins import hookimpl


class KillAt:
    """A test plugin that SIGKILLs one rank, as a crash or ``kill -9`` would, where
    ``DARE_TEST_KILL_AT=<rank>:<step>:<when>`` says: ``when=step`` at the end of that step (its
    metrics written, its checkpoint not), ``when=save`` in the middle of writing that step's
    checkpoint (engine state written, the rest not); ``when=term`` sends SIGTERM at the end of that
    step instead (a clean stop: the run finishes the step and checkpoints)."""

    def __init__(self) -> None:
        rank, step, self.when = os.environ.get("DARE_TEST_KILL_AT", "-1:-1:step").split(":")
        self.step = int(step) if rank == os.environ.get("RANK", "0") else -1
        if self.when == "save" and self.step > 0:
            from dare_core.workflows import checkpoint

            export = checkpoint.export_model

            def export_then_die(ctx: Any, directory: str) -> None:
                if os.path.basename(directory) == f".tmp-step-{self.step}":
                    self._die()
                export(ctx, directory)

            checkpoint.export_model = export_then_die

    @staticmethod
    def _die() -> None:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)

    @hookimpl
    def dare_on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        if self.when == "step" and step == self.step:
            self._die()
        if self.when == "term" and step == self.step:  # as Slurm before it preempts a job
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
