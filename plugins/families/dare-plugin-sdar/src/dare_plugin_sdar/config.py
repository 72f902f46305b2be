"""What the sdar family registers, importable without torch or transformers: its capabilities,
default block size and bundled checkpoint."""

import os

#: ``mask_token`` / ``absorbing_elbo``: an absorbing-state (MASK) diffusion model.
CAPABILITIES = frozenset({"kv_cache", "packed_varlen", "mask_token", "absorbing_elbo"})
#: Block size when the config has none (SDAR-30B-A3B), as the published generation code uses.
DEFAULT_BLOCK_SIZE = 4
BUNDLED = os.path.join(os.path.dirname(__file__), "checkpoints", "tiny-sudoku")
