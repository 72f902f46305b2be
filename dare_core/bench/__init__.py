"""``dare bench``: baseline vs accelerated configurations, interleaved on one machine.

Subcommands: ``rollout`` (:mod:`dare_core.bench.rollout`), ``rl`` (:mod:`dare_core.bench.rl`)
and ``train`` (:mod:`dare_core.bench.train`, whose ``main(argv)`` receives the arguments).
Shared helpers (machine info, peak memory, interleaving, output) are in
:mod:`dare_core.bench.common`.
"""
