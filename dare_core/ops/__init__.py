"""Training-side acceleration kernels written in plain torch.

* :mod:`dare_core.ops.fused_ce` — logits-free (chunked) per-token log-probabilities / diffusion
  cross entropy with a custom backward;
* :mod:`dare_core.ops.packing` — packing variable-length sequences into rows with document
  masks and per-document position ids, and unpacking the results;
* :mod:`dare_core.ops.attention` — document (varlen) attention kernels per device and the
  selection of the training attention path and cross-entropy head for a model wrapper.
"""

from dare_core.ops.fused_ce import (
    ChunkedTokenLogProb,
    fused_diffusion_ce,
    fused_token_logprobs,
    naive_token_logprobs,
)

__all__ = [
    "ChunkedTokenLogProb",
    "fused_diffusion_ce",
    "fused_token_logprobs",
    "naive_token_logprobs",
]
