"""A target for :func:`~dare_core.testing.distributed.run_ranks`: a training run that returns the
one-line error it was refused with (``None`` when it ran)."""

from dare_core.errors import DareError
from dare_core.testing.engines import TINY, train_run


def refusal(plugins, algo, overrides):
    try:
        train_run(plugins, algo, overrides)
    except DareError as exc:
        return str(exc)
    return None


def timed_out_collective(timeout: float, late: float) -> dict:
    """``engine.timeout=<timeout>`` on 2 ranks: rank 1 reaches the all-reduce ``late`` seconds
    after rank 0. Rank 0: the error it got and how long it waited (``None`` on rank 1)."""
    import time

    import torch

    from dare_core.config import resolve
    from dare_core.engines.distributed import ProcessGroup
    from dare_core.testing.engines import BASE_PLUGINS, _plugin
    from dare_core.testing.registries import build_for

    dare = build_for(*[_plugin(p) for p in BASE_PLUGINS])
    overrides = [*TINY, "model.path=unused", "engine.name=ddp", f"engine.timeout={timeout}"]
    config = resolve(dare, algo="sup_test", model="toy", overrides=overrides)
    group = ProcessGroup(config)
    if group.rank == 1:
        time.sleep(late)
        return {}
    start = time.monotonic()
    try:
        group.average([torch.ones(3)])
    except Exception as exc:  # torch.distributed reports the timeout as a RuntimeError subclass
        return {"error": f"{type(exc).__name__}: {exc}", "waited": time.monotonic() - start}
    return {"error": None, "waited": time.monotonic() - start}
