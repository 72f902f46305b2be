"""dare-plugin-deepspeed: the ``deepspeed`` execution engine (DeepSpeed ZeRO stages 1/2/3).

:mod:`dare_plugin_deepspeed.plugin` registers the engine and the ``deepspeed:`` section of the run
config; :mod:`dare_plugin_deepspeed.engine` implements the engine,
:mod:`dare_plugin_deepspeed.config` the section and the DeepSpeed config a run trains with.
"""

__version__ = "0.1.0"
