"""dare-plugin-lmeval: the ``dare`` model of lm-evaluation-harness.

lm-eval 0.4.9 finds models only through ``register_model`` at import time (it has no entry-point
group for models), so the model is registered when :mod:`dare_plugin_lmeval.model` is imported:
``python -m dare_plugin_lmeval ...`` (lm-eval's command line with the model registered) or
``import dare_plugin_lmeval.model`` before ``lm_eval.simple_evaluate(model="dare", ...)``.
Importing this package imports neither lm_eval nor torch.
"""

__version__ = "0.1.0"
