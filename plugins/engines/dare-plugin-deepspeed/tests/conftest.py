"""Set-up of the deepspeed plugin's tests.

``src/`` is put on ``sys.path`` when the package is not installed (a no-op after
``pip install -e .``); spawned processes start with the same path.
"""

from __future__ import annotations

import importlib.util
import os
import sys

if importlib.util.find_spec("dare_plugin_deepspeed") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
