"""Shared machinery of ``dare bench``: models, prompts, memory, timing, tables, machine info.

Every benchmark compares a *baseline* and an *accelerated* configuration on the same checkpoint
and the same inputs, runs them interleaved (A, B, A, B, ...) so that a noisy, shared machine
slows both alike, prints a table and ends with one JSON line (the last line of the output).

Helpers meant for every ``dare bench`` subcommand (the training bench uses them too):

* :func:`machine_info` — platform, CPU/GPU, torch version and threads, load average;
* :class:`PeakMemory` — peak memory of a block of code: CUDA ``max_memory_allocated`` on a GPU,
  otherwise the process's peak resident set size (``VmHWM``, reset before the block through
  ``/proc/self/clear_refs``; where that is not possible, the monotonic ``ru_maxrss``);
* :func:`interleave` — run ``{name: fn}`` ``repeats`` times in A, B, A, B order, timing each;
* :func:`print_table` and :func:`emit_json`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import click
import torch

from dare_core.api import DareError, no_hf_progress_bar

__all__ = [
    "BenchError",
    "PeakMemory",
    "create_checkpoint",
    "emit_json",
    "interleave",
    "machine_info",
    "prepare_model",
    "print_table",
    "random_prompts",
    "ratio",
    "sync",
]


class BenchError(DareError):
    """A ``dare bench`` argument or set-up problem (one line)."""


# --------------------------------------------------------------------------- machine
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(torch.device(device))


# --------------------------------------------------------------------------- memory
def _vm_status_bytes(field: str) -> Optional[int]:
    """``field`` of ``/proc/self/status`` (``VmHWM``, ``VmRSS``) in bytes; ``None`` where unknown."""
    try:
        with open("/proc/self/status") as fh:
            m = re.search(rf"{field}:\s+(\d+)\s+kB", fh.read())
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def _vm_hwm_bytes() -> Optional[int]:
    return _vm_status_bytes("VmHWM")


#: how far above the resident set the high-water mark may sit right after a reset that took effect
RESET_SLACK = 4 * 2**20


def _reset_hwm() -> bool:
    """Reset the process's peak resident set size to its current one; whether that took effect
    (some kernels and sandboxes accept the write and keep the old peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    hwm, rss = _vm_hwm_bytes(), _vm_status_bytes("VmRSS")
    return hwm is not None and rss is not None and hwm - rss <= RESET_SLACK


class PeakMemory:
    """Context manager measuring peak memory in bytes (``.peak``) and how (``.kind``).

    On CUDA: ``torch.cuda.max_memory_allocated`` after a reset (tensors only). On CPU: the
    process's peak resident set size after resetting it (model weights included), kind
    ``rss``; where the reset is impossible or does not take effect, ``ru_maxrss`` since process start (kind
    ``rss_since_start``, an upper bound).
    """

    def __init__(self, device: str):
        self.device = device
        self.peak = 0
        self.kind = ""

    def __enter__(self) -> "PeakMemory":
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.kind = "cuda_max_allocated"
        elif _reset_hwm():
            self.kind = "rss"
        else:
            self.kind = "rss_since_start"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.kind == "cuda_max_allocated":
            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated())
        elif self.kind == "rss":
            self.peak = int(_vm_hwm_bytes() or 0)
        else:
            self.peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# --------------------------------------------------------------------------- running
def interleave(
    runs: dict[str, Callable[[], dict[str, Any]]],
    repeats: int,
    device: str,
    progress: Optional[Callable[[str], None]] = None,
    prepare: Optional[Callable[[str], None]] = None,
) -> dict[str, list[dict[str, Any]]]:
    """Call every ``runs[name]()`` ``repeats`` times in A, B, A, B order.

    Each call returns a dict of per-run facts; ``seconds`` (wall time of the call, device
    synchronised), ``cpu_seconds`` (CPU time of this process during the call: on a shared CPU
    machine with ``--threads 1`` the fairer measure of work, since other processes' load does
    not inflate it), ``peak_memory_bytes`` and ``memory_kind`` are added. ``prepare(name)`` runs
    before each call, outside the timing and the memory measurement (e.g. restoring weights).
    """
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for rep in range(repeats):
        for name, fn in runs.items():
            if prepare is not None:
                prepare(name)
            sync(device)
            with PeakMemory(device) as mem:
                c0, t0 = time.process_time(), time.perf_counter()
                facts = dict(fn())
                sync(device)
                seconds = time.perf_counter() - t0
                cpu_seconds = time.process_time() - c0
            facts.update(seconds=seconds, cpu_seconds=cpu_seconds, peak_memory_bytes=mem.peak, memory_kind=mem.kind)
            out[name].append(facts)
            if progress is not None:
                progress(f"[{rep + 1}/{repeats}] {name}: {seconds:.2f} s")
    return out


def ratio(a: float, b: float) -> Optional[float]:
    """``a / b`` rounded, or ``None`` when ``b`` is 0."""
    return round(a / b, 3) if b else None


# --------------------------------------------------------------------------- models, prompts
def create_checkpoint(dare: Any, family_name: str, out_dir: str, sizes: dict, tokenizer_task: str, seed: int) -> None:
    """Write a randomly initialised checkpoint of the registered family ``family_name`` to
    ``out_dir`` through its ``create`` (``sizes``: its config fields), the tokenizer trained on
    ``tokenizer_task``'s texts like ``dare init``; the global torch seed is set to ``seed`` first."""
    family = dare.registries.models.get(family_name)
    if family.create is None:
        raise BenchError(
            f"model family {family_name!r} cannot create random checkpoints; pass --checkpoint DIR instead of --random"
        )
    from dare_core.api import TaskConfig

    task = dare.registries.tasks.get(tokenizer_task).build(TaskConfig(name=tokenizer_task, seed=seed))
    texts: list[str] = []
    for ex in task.examples("train", limit=500, seed=seed):
        texts.extend(m["content"] for m in ex.prompt)
        if ex.response:
            texts.append(ex.response)
    torch.manual_seed(seed)
    with no_hf_progress_bar():
        family.create(out_dir, texts, **sizes)


def prepare_model(
    dare: Any,
    family_name: str,
    *,
    checkpoint: Optional[str],
    random_sizes: Optional[dict],
    tokenizer_task: str,
    dtype: torch.dtype,
    device: str,
    seed: int,
) -> tuple[Any, str]:
    """Load ``checkpoint`` (default: the family's bundled one) or, with ``random_sizes``, a
    randomly initialised checkpoint of the family's architecture (:func:`create_checkpoint`)
    written to a temporary directory.

    :returns: ``(wrapper, description of the source)``.
    """
    family = dare.registries.models.get(family_name)
    if random_sizes is not None:
        path = tempfile.mkdtemp(prefix="dare-bench-")
        create_checkpoint(dare, family_name, path, random_sizes, tokenizer_task, seed)
        shown = ", ".join(f"{k}={v}" for k, v in random_sizes.items()) or "default sizes"
        source = f"random {family_name} ({shown})"
    else:
        path = checkpoint or family.default_checkpoint
        if not path:
            raise BenchError(
                f"model family {family_name!r} ships no bundled checkpoint; pass --checkpoint DIR or --random"
            )
        source = path
    with no_hf_progress_bar():
        wrapper = family.load(path, dtype=dtype, device=device)
    return wrapper, source


def random_prompts(
    wrapper: Any, batch: int, length: int, seed: int, ragged: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of random non-special token ids, left padded.

    Row ``i`` has ``length - (i * ragged) % length`` real tokens (``ragged = 0``: all full), so
    ``ragged > 0`` exercises left padding.
    """
    vocab = (
        int(wrapper.module.get_input_embeddings().num_embeddings)
        if hasattr(wrapper.module, "get_input_embeddings")
        else None
    )
    tok_len = len(wrapper.tokenizer) if wrapper.tokenizer is not None else None
    high = min(v for v in (vocab, tok_len) if v is not None)
    special = {wrapper.mask_token_id, wrapper.eos_token_id, wrapper.pad_token_id, *wrapper.stop_token_ids}
    special |= set(getattr(wrapper.tokenizer, "all_special_ids", []) or [])
    allowed = torch.tensor([i for i in range(high) if i not in special], dtype=torch.long)
    if allowed.numel() == 0:
        raise BenchError("the tokenizer has no non-special tokens to build random prompts from")
    g = torch.Generator().manual_seed(seed)
    ids = allowed[torch.randint(0, allowed.numel(), (batch, length), generator=g)]
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(batch):
        pad = (i * ragged) % length if ragged else 0
        ids[i, :pad] = wrapper.pad_token_id
        mask[i, :pad] = 0
    return ids, mask


# --------------------------------------------------------------------------- output
def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(str(h))] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    click.echo("  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def emit_json(payload: dict[str, Any]) -> None:
    """The final line of every bench: one JSON object (``tail -n 1 | python -m json.tool``)."""
    click.echo(json.dumps(payload, sort_keys=True))
