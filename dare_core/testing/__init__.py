"""The testing kit for DARE plugin authors:

* :mod:`~dare_core.testing.toy` — a family-free tiny masked-diffusion model (the ``toy`` family);
  the block-diffusion toy (``block_toy``) is :mod:`dare_nn.testing.toy_block` in dare-nn;
* :mod:`~dare_core.testing.contracts` — suites a family or algorithm plugin subclasses in its tests;
* :mod:`~dare_core.testing.digits`, :mod:`~dare_core.testing.rl_probe`,
  :mod:`~dare_core.testing.algorithm_checks` — tasks, test algorithms and checks for loop tests;
* :mod:`~dare_core.testing.engines`, :mod:`~dare_core.testing.distributed` — multi-process checks;
* :mod:`~dare_core.testing.pytest_plugin` — fixtures (``pytest11`` entry point): ``dare_build``,
  ``toy_wrapper``, ``fake_rollout``.
"""

from dare_core.testing.toy import ToyWrapper, fake_rollout, make_toy_wrapper

__all__ = ["ToyWrapper", "fake_rollout", "make_toy_wrapper"]
