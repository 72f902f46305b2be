"""dare-plugin-fsdp: the ``fsdp`` execution engine (PyTorch FSDP2, ``fully_shard``).

One process per device, started by ``torchrun``; every rank holds ``1/world_size`` of the
parameters, gradients and optimizer state as DTensor shards. The engine is
:class:`dare_plugin_fsdp.engine.FSDPEngine`, its options the ``fsdp:`` config section
(:class:`dare_plugin_fsdp.config.FSDPConfig`); :mod:`dare_plugin_fsdp.plugin` registers both.
"""

__version__ = "0.1.0"
