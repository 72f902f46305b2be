"""Make ``src/`` importable when the plugin is not pip-installed (``python -m pytest tests`` right
after ``dare plugin new``); after ``pip install -e .`` this does nothing."""

import importlib.util
import os
import sys

if importlib.util.find_spec("dare_plugin_myalgo") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
