"""A target for :func:`~dare_core.testing.distributed.run_ranks`: a training run that returns the
one-line error it was refused with (``None`` when it ran)."""

from dare_core.errors import DareError
from dare_core.testing.engines import train_run


def refusal(plugins, algo, overrides):
    try:
        train_run(plugins, algo, overrides)
    except DareError as exc:
        return str(exc)
    return None
