"""What the dream family registers, importable without torch or transformers: its capabilities,
bundled checkpoint and the config of its ``dream_generate`` rollout backend."""

from __future__ import annotations

import os

import attrs

from dare_core.api import in_range, non_negative, one_of, option, positive

#: ``mask_token`` / ``absorbing_elbo``: an absorbing-state (MASK) diffusion model.
CAPABILITIES = frozenset({"bidirectional", "kv_cache", "packed_varlen", "mask_token", "absorbing_elbo"})
BUNDLED = os.path.join(os.path.dirname(__file__), "checkpoints", "tiny-sudoku")
#: ``alg`` values of the ``dream_generate`` backend
ALGORITHMS = ("origin", "maskgit_plus", "topk_margin", "entropy")
#: records the ``dream_generate`` backend understands
SUPPORTED_RECORDS = frozenset({"reveal_step"})


@attrs.frozen
class DreamSamplerConfig:
    """Config of the ``dream_generate`` rollout backend (the ``rollout:`` section)."""

    gen_length: int = option(
        256, "Response length R: number of MASK tokens appended to each prompt (Dream's max_new_tokens).", positive
    )
    steps: int = option(256, "Number of denoising steps (one full forward each) over the whole response.", positive)
    alg: str = option(
        "entropy",
        "Which masked positions are committed each step: 'origin' = each "
        "independently with probability 1 - s/t; 'maskgit_plus' / 'topk_margin' / "
        "'entropy' = the n most confident (probability of the candidate / top-1 "
        "minus top-2 probability / negative entropy).",
        one_of(ALGORITHMS),
    )
    temperature: float = option(0.2, "Sampling temperature of the candidate tokens; 0 = argmax.", non_negative)
    top_p: float = option(
        0.95,
        "Nucleus filter applied before the softmax (also to the confidences); 1 = off.",
        in_range(0.0, 1.0, low_open=True),
    )
    top_k: int = option(0, "Keep only the k largest logits before the softmax; 0 = off.", non_negative)
    alg_temp: float = option(
        0.0,
        "0 = commit the n most confident positions; > 0 = draw the n positions from softmax(confidence / alg_temp).",
        non_negative,
    )
    eps: float = option(
        1e-3,
        "Final time of the schedule timesteps = linspace(1, eps, steps + 1).",
        in_range(0.0, 1.0, low_open=True, high_open=True),
    )
    truncate_at_eos: bool = option(
        False,
        "Response mask rule: false = every generated position counts "
        "(the reference's Dream rollout); true = positions up to and "
        "including the first EOS count.",
    )
    micro_batch_size: int = option(
        0,
        "Generate in chunks of this many rows to bound memory; 0 = the "
        "whole batch at once (sampled outputs depend on the chunking).",
        non_negative,
    )
