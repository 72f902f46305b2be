"""Training-side acceleration kernels written in plain torch.

* :mod:`dare_core.ops.fused_ce` — logits-free (chunked) per-token log-probabilities / diffusion
  cross entropy with a custom backward;
* :mod:`dare_core.ops.packing` — packing variable-length sequences into rows with document
  masks and per-document position ids, and unpacking the results;
* :mod:`dare_core.ops.attention` — document (varlen) attention kernels per device;
* :mod:`dare_core.ops.paths` — the choice of the training attention path and cross-entropy
  head for a model wrapper (``model.train_attention``, ``model.cross_entropy``).

The model wrapper (:class:`dare_core.models.HFDiffusionWrapper`) applies the chosen paths
inside ``token_logprobs``, so every estimator and objective uses them without knowing.
"""
