"""Static-shape decode steps of the cached rollout backends and how they run (``graphs``).

A cached rollout spends a forward per step on a few dozen tokens; on a GPU eager PyTorch is then
bound by kernel launches (one per op and layer, whatever the token count). The ``fast`` and
``block`` backends therefore also have a *static* path: every tensor of a decode step has a
shape fixed for the whole rollout (preallocated KV buffers of fixed capacity, fixed query
widths, per-block column indices passed as index tensors), the step reads and writes buffers
that keep their addresses, and nothing in it waits for the host (no ``.item()``, ``.tolist()``
or data-dependent shapes; selection by sorting and masks at fixed shapes). Such a step can be
replayed as one CUDA graph. ``graphs`` chooses how it runs (``eager``, not ``off``: YAML reads
``off`` as a boolean):

* ``eager`` — the backend's eager path (no static buffers);
* ``static`` — the static path, each step called as plain PyTorch (what the captured forms
  replay; on the CPU the tests compare it with ``eager``);
* ``cuda_graph`` — each step kind captured once as a ``torch.cuda.CUDAGraph`` (after one warm-up
  call on a side stream under ``torch.cuda.set_sync_debug_mode("error")``, so a step that
  synchronises with the host is refused before capture) and replayed;
* ``compile`` — each step kind through ``torch.compile`` (``mode="reduce-overhead"`` on CUDA,
  i.e. inductor kernels replayed as CUDA graphs where inductor allows them; the default mode
  elsewhere);
* ``auto`` — ``cuda_graph`` on a CUDA device, ``eager`` elsewhere and for a module with forward
  hooks (FSDP2 and ZeRO-3 gather sharded weights in them); a model whose forward synchronises with
  the host (e.g. a mixture of experts reading its per-expert token counts with ``.tolist()``)
  runs ``static`` with one warning instead.

Captured steps are kept per sampler (:class:`Captures`) and reused by later ``generate`` calls
with the same shapes and the same weight tensors (an optimizer updates weights in place, so an
RL loop captures once); anything else builds a new capture.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Callable, Optional

from dare_core.api import DareError, collective_generation
from dare_plugin_samplers.config import GRAPHS, GRAPHS_HELP

__all__ = ["GRAPHS", "GRAPHS_HELP", "graph_mode", "weights_key", "Step", "Captures"]


def graph_mode(setting: str, device: Any, module: Any = None) -> str:
    """The mode (``eager``, ``static``, ``cuda_graph``, ``compile``) ``setting`` means for
    ``module`` on ``device``; ``DareError`` for ``cuda_graph`` without CUDA. ``auto`` stays eager
    for a module with forward hooks: sharding engines (FSDP2, ZeRO-3) gather weights in them,
    which a captured step would not redo."""
    kind = getattr(device, "type", str(device))
    if setting == "auto":
        hooked = module is not None and any(m._forward_pre_hooks or m._forward_hooks for m in module.modules())
        return "cuda_graph" if kind == "cuda" and not hooked else "eager"
    if setting in ("cuda_graph", "compile") and collective_generation():
        raise DareError(
            f"rollout.graphs={setting} replays captured steps, which cannot step in lockstep "
            f"where forwards are collective (fsdp, ZeRO-3); use rollout.graphs=auto or static"
        )
    if setting == "cuda_graph" and kind != "cuda":
        raise DareError(
            f"rollout.graphs=cuda_graph needs a CUDA device, the model is on {kind}; "
            f"use rollout.graphs=static or compile (or auto)"
        )
    return setting


def weights_key(module: Any) -> tuple:
    """Identity of a module's parameter and buffer tensors (their addresses): a captured step
    stays valid while this is unchanged (in-place updates keep it)."""
    return (
        (id(module),) + tuple(t.data_ptr() for t in module.parameters()) + tuple(t.data_ptr() for t in module.buffers())
    )


class Step:
    """One step kind ``fn(*args)`` (tensors or ``None``; returns a tuple of tensors) run in
    ``mode``; every call must pass tensors of the same shapes (``None`` in the same places).

    ``cuda_graph``: the first call warms ``fn`` up on a side stream, captures it (into the graph
    memory ``pool``) and replays it; later calls replay it, reading the argument tensors where the
    first call had them (a tensor at another address is first copied there). The returned
    tensors are the graph's own outputs, overwritten by the next replay. ``auto`` marks a mode
    chosen by ``graphs=auto``: a step that synchronises with the host then runs uncaptured.
    """

    def __init__(self, fn: Callable[..., tuple], mode: str, device: Any, pool: Any = None, auto: bool = False):
        self.fn, self.mode, self.pool, self.auto = fn, mode, pool, auto
        self.graph: Any = None
        self.inputs: list = []
        self.outputs: tuple = ()
        if mode == "compile":
            import torch

            cuda = getattr(device, "type", str(device)) == "cuda"
            self.fn = torch.compile(fn, dynamic=False, mode="reduce-overhead" if cuda else None)

    def __call__(self, *args: Any) -> tuple:
        if self.mode != "cuda_graph":
            return self.fn(*args)
        if self.graph is None:
            self._capture(args)
            if self.mode != "cuda_graph":  # fell back
                return self.fn(*args)
        else:
            for held, a in zip(self.inputs, args):
                if a is not None and a.data_ptr() != held.data_ptr():
                    held.copy_(a)
        self.graph.replay()
        return self.outputs

    def _capture(self, args: tuple) -> None:
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        previous = torch.cuda.get_sync_debug_mode()
        try:
            with torch.cuda.stream(side):
                torch.cuda.set_sync_debug_mode("error")
                self.fn(*args)
        except RuntimeError as exc:
            if "synchroniz" not in str(exc):
                raise
            return self._uncapturable("the model's forward synchronises with the host", exc)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn(*args)
        except RuntimeError as exc:
            return self._uncapturable("capturing it failed", exc)
        self.graph, self.inputs, self.outputs = graph, list(args), tuple(outputs)

    def _uncapturable(self, why: str, exc: Exception) -> None:
        """``auto``: run uncaptured from now on, with a warning; else a one-line error."""
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not self.auto:
            raise DareError(
                f"rollout.graphs=cuda_graph: the decode step cannot be captured, {why} "
                f"({detail}); use rollout.graphs=static"
            ) from None
        warnings.warn(
            f"rollout.graphs=auto: the decode step cannot be captured, {why} ({detail}); "
            f"running the static steps uncaptured",
            stacklevel=4,
        )
        self.mode = "static"


class Captures:
    """The last ``size`` captures (static buffers and captured steps) of a sampler, by key."""

    def __init__(self, size: int = 2):
        self.size = size
        self._items: OrderedDict = OrderedDict()

    def get(self, key: tuple, build: Callable[[], Any]) -> Any:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        while len(self._items) >= self.size:
            self._items.popitem(last=False)
        item = self._items[key] = build()
        return item


def graph_pool(mode: str) -> Optional[Any]:
    """A CUDA graph memory pool the steps of one capture share (they never run concurrently)."""
    if mode != "cuda_graph":
        return None
    import torch

    return torch.cuda.graph_pool_handle()
