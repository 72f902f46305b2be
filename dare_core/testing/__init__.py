"""The testing kit for DARE plugin authors.

* :mod:`dare_core.testing.toy` — a family-free tiny masked-diffusion model with a character
  tokenizer, registrable as the ``toy`` family, for testing algorithms without any family plugin;
* :mod:`dare_core.testing.digits` — a ``digits`` task and test-only RL / SFT algorithms composed
  from core components (:class:`~dare_core.testing.digits.DigitsPlugin`), for loop tests;
* :mod:`dare_core.testing.contracts` — contract test classes a family or algorithm plugin
  subclasses in its own tests (``class TestMyFamily(ModelFamilyContract): family = "x"``);
* :mod:`dare_core.testing.pytest_plugin` — fixtures (auto-loaded through the ``pytest11`` entry
  point): ``dare_build``, ``toy_wrapper``, ``fake_rollout``.

The block-diffusion toy (``block_toy`` family) is :mod:`dare_nn.testing.toy_block` in dare-nn.
"""

from dare_core.testing.toy import ToyWrapper, fake_rollout, make_toy_wrapper

__all__ = ["ToyWrapper", "fake_rollout", "make_toy_wrapper"]
