"""The core's model-family contract, run on the LLaDA2 plugin (a fresh tiny MoE from ``create``)."""

import dare_plugin_llada2
from dare_core.testing.contracts import ModelFamilyContract


class TestLLaDA2Contract(ModelFamilyContract):
    family = "llada2"
    plugins = (dare_plugin_llada2,)
    create_kwargs = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=48,
        moe_intermediate_size=16,
        vocab_size=300,
        block_size=4,
    )
