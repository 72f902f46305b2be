"""The tests' helpers (:mod:`fsdp_runs`) are a module of this folder: it is put on ``sys.path``,
which the spawned rank processes inherit. ``src/`` is added when the package is not installed."""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
if importlib.util.find_spec("dare_plugin_fsdp") is None:
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
