"""User-facing errors: every error a user can cause is a :class:`DareError`, which the CLI prints as
one ``error:`` line with exit status 2 (``DARE_DEBUG=1``: its traceback instead); bugs keep theirs."""

from __future__ import annotations

import sys
from typing import Callable, NoReturn


class DareError(Exception):
    """An error caused by user input; its message names the problem and the fix."""

    #: the CLI's exit status for it
    exit_status: int = 2


class UnknownNameError(DareError, KeyError):
    """A registry was asked for a name nobody registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateNameError(DareError):
    """Two plugins registered the same name in one registry."""


class ConfigError(DareError):
    """One or more configuration problems, all listed in one message."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = "invalid configuration" if n == 1 else f"invalid configuration ({n} problems)"
        super().__init__(f"{head}: " + "; ".join(self.problems))


class CapabilityError(DareError):
    """The chosen combination of model, algorithm and backend is not supported."""


class PromptFitError(DareError):
    """A task's prompts do not fit the prompt limit or the model's context (``dare eval`` skips
    such a task among several and runs the others): ``longest`` prompt tokens (plus the
    generation, where the context is the limit) against ``limit``."""

    def __init__(self, message: str, longest: int = 0, limit: int = 0):
        super().__init__(message)
        self.longest, self.limit = longest, limit


class Preempted(DareError):
    """A stop signal (``trainer.stop_signals``, e.g. Slurm's SIGTERM before it kills a job) ended
    the run after a step, with a training checkpoint written; ``trainer.resume=auto`` continues
    it. Exit status 75 (``EX_TEMPFAIL``: try again), so a requeue script can tell it from a failure."""

    exit_status = 75


class DivergenceError(DareError):
    """Training produced non-finite values (loss, gradient norm or weights) and was stopped."""


def run_script(main: Callable[[], int]) -> NoReturn:
    """Exit with ``main()``'s status; a :class:`DareError` becomes one ``error:`` line on stderr
    and status 2, as in the CLI (for the repository's ``scripts/``)."""
    try:
        status = main()
    except DareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_status) from None
    raise SystemExit(status)
