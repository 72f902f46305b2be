"""What the llada2 family registers, importable without torch or transformers: its capabilities,
bundled checkpoint, default block size and the configs of its two rollout backends."""

from __future__ import annotations

import os

import attrs

from dare_core.api import in_range, non_negative, one_of, option, positive

#: ``mask_token`` / ``absorbing_elbo``: an absorbing-state (MASK) diffusion model.
CAPABILITIES = frozenset({"block_diffusion", "kv_cache", "packed_varlen", "mask_token", "absorbing_elbo"})
BUNDLED = os.path.join(os.path.dirname(__file__), "checkpoints", "tiny-sudoku")
#: Block size of the published evaluations and SFT trainer (plugin README); a checkpoint may
#: override it with a ``block_size`` entry in its config.json.
DEFAULT_BLOCK_SIZE = 32
#: records the ``llada2_threshold`` and ``llada2_editing`` backends understand
SUPPORTED_RECORDS = frozenset({"reveal_step"})


@attrs.frozen
class ThresholdConfig:
    """The ``llada2_threshold`` rollout backend (LLaDA2.0 ``generate``)."""

    gen_length: int = option(256, "Response length R (tokens generated after each prompt).", positive)
    block_length: int = option(
        0,
        "Block size B of the denoising grid; 0 = the model's block size (32 for the published "
        "checkpoints, the value training used).",
        non_negative,
    )
    steps: int = option(
        32,
        "Maximum denoising iterations per block (published default 32); capped at gen_length // minimal_topk.",
        positive,
    )
    minimal_topk: int = option(1, "Published knob: steps = min(steps, gen_length // minimal_topk).", positive)
    threshold: float = option(
        0.95,
        "Commit every masked position whose candidate probability exceeds this, when there are at least quota of them.",
        in_range(0.0, 1.0),
    )
    temperature: float = option(0.0, "Sampling temperature of the candidates; 0 = see zero_temperature.", non_negative)
    zero_temperature: str = option(
        "greedy",
        "Meaning of temperature 0: 'greedy' = argmax (DARE's convention); 'sample' = the "
        "published 2.0 behaviour (logits left unscaled and still sampled).",
        one_of(("greedy", "sample")),
    )
    top_k: int = option(0, "Keep only the k most likely tokens before sampling; 0 = off.", non_negative)
    top_p: float = option(1.0, "Nucleus sampling mass; 1 = off.", in_range(0.0, 1.0, low_open=True))
    use_cache: bool = option(
        False,
        "Forward only the current block on a KV cache of the finished blocks "
        "(same tokens as without cache, up to float rounding).",
    )
    micro_batch_size: int = option(0, "Generate in chunks of this many rows; 0 = the whole batch.", non_negative)


@attrs.frozen
class EditingConfig:
    """The ``llada2_editing`` rollout backend (LLaDA2.1 ``generate``)."""

    gen_length: int = option(256, "Response length R (tokens generated after each prompt).", positive)
    block_length: int = option(0, "Block size B of the denoising grid; 0 = the model's block size.", non_negative)
    threshold: float = option(
        0.95,
        "Commit every masked position whose candidate probability exceeds "
        "this, when there are at least num_to_transfer of them.",
        in_range(0.0, 1.0),
    )
    num_to_transfer: int = option(
        1,
        "Masked positions committed per iteration when fewer than that exceed the threshold (the most probable ones).",
        positive,
    )
    editing_threshold: float = option(
        0.9,
        "Re-write a decoded non-prompt token of the current block when "
        "the new candidate differs and its probability exceeds this.",
        in_range(0.0, 1.0),
    )
    max_post_steps: int = option(
        16, "Iterations allowed per block after its last MASK is gone (editing only).", non_negative
    )
    temperature: float = option(0.0, "Sampling temperature of the candidates; 0 = argmax.", non_negative)
    top_k: int = option(0, "Keep only the k most likely tokens before sampling; 0 = off.", non_negative)
    top_p: float = option(1.0, "Nucleus sampling mass; 1 = off.", in_range(0.0, 1.0, low_open=True))
    mask_style: str = option(
        "strict",
        "'strict' = block-causal mask (what training uses); 'additive_01' = the published 2.1 "
        "code's 0/1 additive mask (+1 on visible keys, nothing hidden).",
        one_of(("strict", "additive_01")),
    )
    use_cache: bool = option(
        False, "Forward only the current block on a KV cache of the finished blocks (strict mask only)."
    )
    micro_batch_size: int = option(0, "Generate in chunks of this many rows; 0 = the whole batch.", non_negative)

    def __attrs_post_init__(self) -> None:
        if self.use_cache and self.mask_style != "strict":
            raise ValueError(
                "rollout.use_cache needs rollout.mask_style='strict' (with the 0/1 additive mask "
                "earlier blocks see later ones, so their keys cannot be cached); set one of them"
            )
