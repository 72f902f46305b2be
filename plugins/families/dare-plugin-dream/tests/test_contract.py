"""The core's model-family contract, run on the Dream plugin."""

import dare_plugin_dream
from dare_core.testing.contracts import ModelFamilyContract


class TestDreamContract(ModelFamilyContract):
    family = "dream"
    plugins = (dare_plugin_dream,)
    create_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=300,
    )
