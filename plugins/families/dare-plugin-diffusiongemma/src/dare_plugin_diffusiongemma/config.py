"""What the diffusiongemma family registers, importable without torch or transformers: its
capabilities, bundled checkpoint and the config of its ``entropy_bound`` rollout backend."""

from __future__ import annotations

import os
from typing import Optional

import attrs

from dare_core.api import non_negative, option, optional, positive

#: ``uniform_noise``: the forward noise replaces tokens by uniform random ones (no MASK token).
CAPABILITIES = frozenset({"uniform_noise"})
BUNDLED = os.path.join(os.path.dirname(__file__), "checkpoints", "tiny-sudoku")
#: the model type transformers registers for DiffusionGemmaForBlockDiffusion checkpoints
MODEL_TYPE = "diffusion_gemma"
#: records the ``entropy_bound`` backend understands
RECORDS = frozenset({"reveal_step"})

_FROM_CHECKPOINT = " null = the checkpoint's generation_config.json (else transformers' default)."


@attrs.frozen
class EntropyBoundConfig:
    """Config of the ``entropy_bound`` rollout backend (the ``rollout:`` section): transformers'
    ``DiffusionGemmaForBlockDiffusion.generate`` with its entropy-bound sampler."""

    gen_length: int = option(
        256,
        "Response length R: generation runs ceil(R / canvas_length) canvases (transformers' "
        "max_new_tokens = R) and the response is cut to R tokens.",
        positive,
    )
    temperature: float = option(
        1.0,
        "Multiplies the schedule's temperatures (1 = the checkpoint's schedule); 0 = every proposal "
        "is its argmax token, so each step accepts the whole canvas and the canvas is iterated to its "
        "argmax fixed point (deterministic given the initial noise). DARE's commands and recipes set "
        "it (dare generate and evaluation: eval.temperature; group-RL recipes: 0.6).",
        non_negative,
    )
    max_denoising_steps: Optional[int] = option(
        None,
        "Denoising steps per canvas at most (adaptive stopping may end a canvas earlier)." + _FROM_CHECKPOINT,
        optional(positive),
    )
    t_min: Optional[float] = option(
        None,
        "Temperature of the last denoising step (linear schedule t_max -> t_min)." + _FROM_CHECKPOINT,
        optional(non_negative),
    )
    t_max: Optional[float] = option(
        None, "Temperature of the first denoising step; must exceed t_min." + _FROM_CHECKPOINT, optional(positive)
    )
    entropy_bound: Optional[float] = option(
        None,
        "Entropy-bound acceptance: a step accepts the lowest-entropy tokens while their summed "
        "entropy minus the largest stays within this bound; the others are renoised." + _FROM_CHECKPOINT,
        optional(positive),
    )
    stability_threshold: Optional[int] = option(
        None,
        "Adaptive stopping: steps the argmax canvas must stay unchanged (0 = no stability "
        "condition)." + _FROM_CHECKPOINT,
        optional(non_negative),
    )
    confidence_threshold: Optional[float] = option(
        None,
        "Adaptive stopping: the mean token entropy of the tempered logits must fall below this." + _FROM_CHECKPOINT,
        optional(positive),
    )

    def __attrs_post_init__(self) -> None:
        if self.t_min is not None and self.t_max is not None and self.t_max <= self.t_min:
            raise ValueError(f"rollout.t_max ({self.t_max}) must exceed rollout.t_min ({self.t_min})")
        for name in ("max_denoising_steps", "stability_threshold"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"rollout.{name} must be an integer, got {value!r}")
