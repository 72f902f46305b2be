"""What a command writes where: results on stdout (the commands' own ``click.echo``), progress,
logs and warnings on stderr. ``dare --quiet`` (or ``DARE_QUIET=1``, which the launched ranks
inherit) turns the progress bars and log lines off; warnings and errors stay."""

from __future__ import annotations

import os
import sys

#: the environment variable ``dare --quiet`` sets
QUIET_ENV = "DARE_QUIET"


def quiet() -> bool:
    """Whether progress bars and log lines are off (``dare --quiet`` or ``DARE_QUIET=1``)."""
    return os.environ.get(QUIET_ENV, "") not in ("", "0")


def info(message: str) -> None:
    """A log line on stderr (above any progress bar), unless quiet.

    Args:
        message: one line.
    """
    if quiet():
        return
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)
