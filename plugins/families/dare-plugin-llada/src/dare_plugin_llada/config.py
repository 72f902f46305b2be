"""What the llada family registers, importable without torch or transformers: its capabilities
and bundled checkpoint."""

import os

#: ``kv_cache``: the native module honours DARE's KV-cache contract (``past_key_values`` /
#: ``use_cache``), so cached rollouts can drive it through ``HFDiffusionWrapper.forward_cached``.
#: ``mask_token`` / ``absorbing_elbo``: an absorbing-state (MASK) diffusion model.
CAPABILITIES = frozenset({"bidirectional", "packed_varlen", "kv_cache", "mask_token", "absorbing_elbo"})
BUNDLED = os.path.join(os.path.dirname(__file__), "checkpoints", "tiny-sudoku")
