"""DARE core: the dLLM Alignment and Reinforcement Executor.

The core owns the training loops, config, CLI and evaluation; model families and algorithms are
plugins that reach it through the hooks in :mod:`dare_core.hookspecs`.
"""

from dare_core._version import __version__  # noqa: E402
from dare_core.plugins import hookimpl  # noqa: E402

__all__ = ["hookimpl", "__version__"]
