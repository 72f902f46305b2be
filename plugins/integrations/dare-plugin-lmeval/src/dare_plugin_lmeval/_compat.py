"""Import lm-eval 0.4.9 under transformers 5.

lm-eval 0.4.9 reads ``transformers.AutoModelForVision2Seq`` when it is imported (its multimodal HF
model class); transformers 5 renamed that class ``AutoModelForImageTextToText``, so the import
fails. :func:`load_lm_eval` restores the old name as an alias first (it only matters to lm-eval's
own HF multimodal model, which the ``dare`` model does not use). ``peft`` and ``evaluate``, which
lm-eval imports, replace the ``transformers`` module object on import, so they come first.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def load_lm_eval() -> ModuleType:
    """``lm_eval``, imported; ``ImportError`` when it is not installed."""
    if "lm_eval" not in sys.modules:
        for dep in ("peft", "evaluate"):
            try:
                importlib.import_module(dep)
            except ImportError:
                pass
        import transformers

        if not hasattr(transformers, "AutoModelForVision2Seq") and hasattr(transformers, "AutoModelForImageTextToText"):
            transformers.AutoModelForVision2Seq = transformers.AutoModelForImageTextToText
    return importlib.import_module("lm_eval")
