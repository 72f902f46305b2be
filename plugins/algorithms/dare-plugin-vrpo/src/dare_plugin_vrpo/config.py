"""VRPO's options and recipe (importable without torch: registering the algorithm reads them)."""

from __future__ import annotations

from typing import Literal, Optional

import attrs

from dare_core.api import option, positive


def _divides_mc_num(inst, attr, value) -> None:
    if value is not None and (value < 1 or inst.mc_num % value):
        raise ValueError(f"{attr.name} must divide mc_num={inst.mc_num} (null = mc_num), got {value!r}")


@attrs.frozen
class VRPOConfig:
    """VRPO options with the LLaDA 1.5 / DARE recipe defaults."""

    beta: float = option(0.2, "DPO inverse temperature β (applied to the normalised ELBO differences).", positive)
    mc_num: int = option(4, "Monte-Carlo corruption rows per sequence (the ELBO sample budget).", positive)
    n_l: Optional[int] = option(
        None, "Rows per stratified group (one k ~ U{1..L} per group); null = mc_num.", _divides_mc_num
    )
    normalize: Literal["padded", "valid", "none"] = option(
        "padded",
        "ELBO normaliser: padded = divide by the padded response length R (reference "
        "behaviour, effective β/R); valid = by each response's valid length; none = raw ELBO.",
    )


# Recipe (LLaDA 1.5 via DARE, 8 GPUs): 64 pairs per step, lr 5e-7, wd 0.01, micro-batch 4 rows
# (2 pairs), mc_num = n_l = 4, beta 0.2, prompts/responses up to 512 tokens.
RECIPE = {
    "trainer": {
        "lr": 5e-7,
        "weight_decay": 0.01,
        "batch_size": 64,
        "micro_batch_size": 4,
        "max_prompt_length": 512,
        "max_response_length": 512,
        "grad_clip": 1.0,
    },
}
