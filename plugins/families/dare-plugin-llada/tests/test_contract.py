"""The core's model-family contract, run on the LLaDA plugin."""

import dare_plugin_llada
from dare_core.testing.contracts import ModelFamilyContract


class TestLLaDAContract(ModelFamilyContract):
    family = "llada"
    plugins = (dare_plugin_llada,)
    create_kwargs = dict(d_model=32, n_heads=2, n_kv_heads=2, n_layers=2, mlp_hidden_size=48, vocab_size=300)
