"""A process's memory over a block of code, read from Linux's ``/proc/self/status``: what the
sharded-loading tests and ``dare bench engines`` measure (a rank's host memory while it loads)."""

from __future__ import annotations

import re
import threading
import time


def status_kib(key: str) -> int:
    """A figure of ``/proc/self/status`` (``VmRSS``, ``RssAnon``, ...), in KiB."""
    with open("/proc/self/status") as fh:
        found = re.search(rf"{key}:\s+(\d+)", fh.read())
    if found is None:
        raise KeyError(f"/proc/self/status has no {key}")
    return int(found.group(1))


class PeakSampler:
    """The largest rise of one ``/proc/self/status`` figure while the block runs, sampled by a
    thread every half millisecond (and at the end): a state that lasts, e.g. a whole model
    materialised, cannot be missed; a transient shorter than a sample can.

    ``RssAnon`` is the process's private memory: not the page cache of files it maps (a
    checkpoint read through mmap), which the processes of a node share and the kernel reclaims.

    Attributes:
        gain: bytes, the peak minus the figure when the block started.
    """

    def __init__(self, key: str = "RssAnon", interval: float = 0.0005):
        self.key, self.interval, self.gain = key, interval, 0
        self._stop = threading.Event()
        self._base = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "PeakSampler":
        self._base = status_kib(self.key)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._note()
            time.sleep(self.interval)

    def _note(self) -> None:
        self.gain = max(self.gain, (status_kib(self.key) - self._base) * 1024)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._note()
