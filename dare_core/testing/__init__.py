"""The testing kit for DARE plugin authors.

* :mod:`dare_core.testing.toy` — a family-free tiny masked-diffusion model with a character
  tokenizer, registrable as the ``toy`` family, for testing algorithms without any family plugin;
* :mod:`dare_core.testing.toy_block` — the same for block diffusion (``block_toy`` family, kind
  ``block``, block size 4, KV cache), for the block-diffusion paths of algorithms and backends;
* :mod:`dare_core.testing.digits` — a ``digits`` task and test-only RL / SFT algorithms composed
  from core components (:class:`~dare_core.testing.digits.DigitsPlugin`), for loop tests;
* :mod:`dare_core.testing.contracts` — contract test classes a family or algorithm plugin
  subclasses in its own tests (``class TestMyFamily(ModelFamilyContract): family = "x"``);
* :mod:`dare_core.testing.pytest_plugin` — fixtures (auto-loaded through the ``pytest11`` entry
  point): ``dare_build``, ``toy_wrapper``, ``toy_block_wrapper``, ``fake_rollout``.
"""

from dare_core.testing.toy import ToyWrapper, fake_rollout, make_toy_wrapper
from dare_core.testing.toy_block import ToyBlockWrapper, make_toy_block_wrapper

__all__ = ["ToyBlockWrapper", "ToyWrapper", "fake_rollout", "make_toy_block_wrapper", "make_toy_wrapper"]
