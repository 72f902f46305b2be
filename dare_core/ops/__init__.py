"""Training-side acceleration kernels written in plain torch: logits-free cross entropy
(:mod:`~dare_core.ops.fused_ce`), packing of variable-length sequences (:mod:`~dare_core.ops.packing`),
document attention kernels (:mod:`~dare_core.ops.attention`) and the choice of the training paths
(:mod:`~dare_core.ops.paths`). The model wrapper (:class:`dare_core.models.base.HFDiffusionWrapper`)
applies the chosen paths inside ``token_logprobs``, so every estimator and objective uses them.
"""
