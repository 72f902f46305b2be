"""Run a function in several processes joined as a gloo process group, as ``torchrun`` would
start them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), for tests
of distributed engines on the CPU.

``run_ranks(2, fn, *args)`` returns every rank's return value in rank order. Like torchrun, it
stops the other ranks when one dies; a rank's exception is raised here with its traceback text.
``fn`` and its arguments must be picklable (a module-level function).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import traceback
from typing import Any, Callable, Optional


class RankFailed(RuntimeError):
    """A rank raised or died; ``exitcodes`` holds every rank's exit code (None = still running
    when the others were stopped)."""

    def __init__(self, message: str, exitcodes: list[Optional[int]]):
        super().__init__(message)
        self.exitcodes = exitcodes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, env: dict[str, str], results: Any, fn: Callable, args: tuple) -> None:
    os.environ.update(env)
    import torch  # already imported with fn's module: apply the thread count now

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        # plain pickle: tensors travel by value, not as shared memory a finished process closes
        results.put((rank, "ok", pickle.dumps(fn(*args))))
    except BaseException:  # noqa: BLE001 (reported to the parent)
        results.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None


def run_ranks(
    nprocs: int, fn: Callable[..., Any], *args: Any, timeout: float = 600, env: Optional[dict[str, str]] = None
) -> list[Any]:
    """``fn(*args)`` in ``nprocs`` spawned processes (one thread each unless ``env`` says
    otherwise); their return values in rank order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    procs = [
        ctx.Process(target=_entry, args=(r, nprocs, port, env, results, fn, args), daemon=False) for r in range(nprocs)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        while len(out) < nprocs:
            try:
                rank, status, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:  # a rank died without reporting (killed): stop the others, like torchrun
                    raise RankFailed(
                        f"rank {procs.index(dead[0])} died with exit code {dead[0].exitcode}", _stop(procs)
                    ) from None
                timeout -= 1.0
                if timeout <= 0:
                    raise RankFailed("ranks timed out", _stop(procs)) from None
                continue
            if status == "error":
                raise RankFailed(f"rank {rank} failed:\n{value}", _stop(procs))
            out[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(nprocs)]


def _stop(procs: list[Any]) -> list[Optional[int]]:
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    return codes
