"""SFT's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

import attrs

from dare_core.api import in_range, non_negative, one_of, option, positive


@attrs.frozen
class SFTConfig:
    """Options of the NELBO objective (defaults from the masked-diffusion SFT recipe)."""

    eps: float = option(
        1e-3, "Noise floor: t = (1 - eps) u + eps with u ~ U(0, 1).", in_range(0.0, 1.0, high_open=True)
    )
    mc_num: int = option(1, "Corruption draws per sequence and step.", positive)
    pad_with_eos: bool = option(
        True,
        "Pad responses with EOS that is attended and trained (the model learns to fill the "
        "rest of the generation window with EOS); false = pad id, not attended, not trained.",
    )
    response_length: int = option(
        0, "Pad every response to this many tokens (match rollout.gen_length); 0 = longest in batch.", non_negative
    )
    # --- block-diffusion models (wrapper.kind == "block"; see dare_plugin_sft.block) -----------
    block_t_low: float = option(
        0.0, "Block diffusion: lower end of the per-sequence noise level t ~ U(low, high).", in_range(0.0, 1.0)
    )
    block_t_high: float = option(
        1.0,
        "Block diffusion: upper end of t ~ U(low, high); the masking probability is (1 - eps) t + eps.",
        in_range(0.0, 1.0),
    )
    block_weighting: str = option(
        "elbo",
        "Block diffusion loss: 'elbo' = sum CE / p over masked tokens / number of trained "
        "response tokens (BD3LM/SDAR); 'none' = sum CE over masked tokens / number of trained "
        "response tokens (no 1/p weight). Token counts are the step's (all micro-batches "
        "and ranks).",
        one_of(("elbo", "none")),
    )

    def __attrs_post_init__(self) -> None:
        if self.block_t_low > self.block_t_high:
            raise ValueError(
                f"algorithm.block_t_low ({self.block_t_low}) must not exceed "
                f"algorithm.block_t_high ({self.block_t_high}); swap them"
            )


# Recipe: AdamW(lr 1e-4, betas (0.9, 0.95), wd 0.01), cosine schedule with 10% warmup, clip 1.
RECIPE = {
    "trainer": {
        "lr": 1e-4,
        "beta1": 0.9,
        "beta2": 0.95,
        "weight_decay": 0.01,
        "lr_schedule": "cosine",
        "warmup_ratio": 0.1,
        "grad_clip": 1.0,
    },
}
