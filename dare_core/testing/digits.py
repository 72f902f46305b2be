"""A ``digits`` task and two test-only algorithms (RL and SFT) composed from core components, for
loop tests, registered by :class:`DigitsPlugin`::

    dare = build(load_entrypoints=False, extra_plugins=[toy, DigitsPlugin()])
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from dare_core.config import option
from dare_core.interfaces import AlgorithmSpec, Example, RLComponents, Score, SFTComponents, TaskSpec
from dare_core.plugins import hookimpl

__all__ = ["ClipConfig", "DigitsPlugin", "DigitsTask", "masked_nll", "pg_components", "sup_components"]


class DigitsTask:
    """Prompt ``n<k>``, reference answer ``k``, SFT response ``kkkk``; reward = fraction of digit
    characters in the response, accuracy = all of them (non-empty)."""

    name = "digits"
    #: examples per split when no ``limit`` is given
    default_limit = 64

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def examples(self, split: str, limit: Optional[int] = None, seed: int = 0) -> list[Example]:
        n = limit or self.default_limit
        off = 0 if split == "train" else 1000
        return [
            Example(
                [{"role": "user", "content": f"n{(i + off) % 10}"}],
                str((i + off) % 10),
                "digits",
                response=str((i + off) % 10) * 4,
            )
            for i in range(n)
        ]

    def score(self, example: Example, response: str) -> Score:
        frac = sum(c.isdigit() for c in response) / max(1, len(response))
        return Score(frac, float(len(response) > 0 and frac == 1.0), response)


@attrs.frozen
class ClipConfig:
    clip: float = option(0.2, "clip epsilon")


def pg_components(cfg: Any, lookup: Any) -> RLComponents:
    """Clipped policy gradient (``cfg.clip`` both ways) on one ``random_ratio`` Monte-Carlo row."""
    return RLComponents(
        corruption=lookup.corruption("random_ratio", mc_num=1),
        trajectory=lookup.trajectory("final_sequence"),
        estimator=lookup.estimator("response_token_logprob"),
        loss=lookup.loss("clipped_pg", clip_ratio_low=cfg.clip, clip_ratio_high=cfg.clip),
        advantage=lookup.advantage("group_norm"),
    )


class MaskedNLL:
    """``-Σ log p / p_mask`` over the masked tokens divided by the step's response tokens
    (``totals``, the masked-diffusion SFT normaliser of arXiv:2502.09992); reports the masked count."""

    def totals(self, batch: Any) -> dict:
        return {"tokens": batch.response_mask.double().sum()}

    def __call__(self, logp: Any, corrupted: Any, batch: Any, *, totals: Optional[dict] = None):
        n = (totals or self.totals(batch))["tokens"].to(logp.dtype).clamp_min(1.0)
        return -(logp / corrupted.p_mask.clamp_min(1e-6)).sum() / n, {"masked": float(corrupted.masked.sum())}


masked_nll = MaskedNLL()


def sup_components(cfg: Any, lookup: Any) -> SFTComponents:
    """Supervised masked-token cross entropy (:func:`masked_nll`) on ``random_ratio`` masks."""
    return SFTComponents(
        corruption=lookup.corruption("random_ratio"),
        estimator=lookup.estimator("masked_token_logprob"),
        loss=masked_nll,
    )


class DigitsPlugin:
    """Registers ``task`` (default :class:`DigitsTask`) as ``digits``, :func:`pg_components` as
    the RL algorithm ``rl_name`` (with ``rl_recipe``) and :func:`sup_components` as the SFT
    algorithm ``sft_name``; a name of ``None`` leaves that algorithm out."""

    def __init__(
        self,
        task: type = DigitsTask,
        rl_name: Optional[str] = "pg_test",
        sft_name: Optional[str] = "sup_test",
        rl_recipe: Optional[dict] = None,
        config_cls: type = ClipConfig,
    ):
        self.task, self.rl_name, self.sft_name = task, rl_name, sft_name
        self.rl_recipe, self.config_cls = rl_recipe, config_cls

    @hookimpl
    def dare_register_tasks(self, register):
        register(TaskSpec("digits", self.task, "test task"))

    @hookimpl
    def dare_register_algorithms(self, register):
        if self.rl_name:
            recipe = {"recipe": self.rl_recipe} if self.rl_recipe is not None else {}
            register(AlgorithmSpec(self.rl_name, "rl", self.config_cls, pg_components, **recipe))
        if self.sft_name:
            register(AlgorithmSpec(self.sft_name, "sft", self.config_cls, sup_components))
