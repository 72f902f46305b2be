"""The ``preference:`` section of the run config (registered by this plugin with
``dare_register_config_sections``): where the preference workflow's pairs come from."""

from __future__ import annotations

from typing import Optional

import attrs

from dare_core.api import in_range, non_negative, option, positive

SECTION = "preference"


@attrs.frozen
class PreferenceConfig:
    """Where the preference workflow's (prompt, chosen, rejected) pairs come from."""

    train_path: Optional[str] = option(
        None,
        "Training pairs: .parquet/.jsonl with prompt, chosen, rejected (UltraFeedback style); "
        "null = generate pairs from the model's own rollouts on task.name.",
    )
    eval_path: Optional[str] = option(
        None,
        "Held-out pairs; null = generated from the task's eval prompts (or, with train_path, "
        "the last num_eval pairs of the training file, held out from training).",
    )
    num_eval: int = option(64, "Held-out pairs used for the validation DPO loss and margin; 0 = none.", non_negative)
    gen_prompts: int = option(256, "Training prompts used to generate pairs (null train_path).", positive)
    gen_eval_prompts: int = option(128, "Eval prompts used to generate held-out pairs (null eval_path).", positive)
    gen_samples: int = option(
        8, "Sampled rollouts per prompt when generating pairs (best vs worst).", in_range(2, 1_000_000)
    )
    gen_temperature: float = option(1.0, "Sampling temperature of the pair-generating rollouts.", non_negative)
    require_correct: bool = option(
        False, "Generated pairs: chosen must be fully correct and rejected not (else best vs worst score)."
    )
    response_length: int = option(
        0, "Pad every response to this many tokens (0 = the longest in the batch); longer ones are cut.", non_negative
    )
    pad_with_eos: bool = option(
        False, "Pad responses with EOS that is attended and scored (false = pad id, not attended)."
    )
    eval_seed: int = option(1234, "Seed of the fixed corruption used for every validation pass.")
