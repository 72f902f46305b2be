"""The core's algorithm contract suite on ``reinforce_rloo`` (family-free toy model)."""

import dare_plugin_reinforce_rloo
from dare_core.testing.contracts import AlgorithmContract


class TestReinforceRLOOContract(AlgorithmContract):
    algorithm = "reinforce_rloo"
    plugins = (dare_plugin_reinforce_rloo,)
