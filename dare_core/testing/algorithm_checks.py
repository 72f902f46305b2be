"""Reusable checks for algorithm plugin tests: build an algorithm's components from options, run
one RL step through the core loop on a toy family, and check that a loss's Monte-Carlo
accumulation (``Components.accumulate``) gives the gradient of one backward over all rows."""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import torch

from dare_core.components import ComponentLookup
from dare_core.config.structure import structure_or_raise
from dare_core.testing.registries import build_for
from dare_core.testing.rl_probe import ProbePlugin, tiny_rl_run


def algorithm_components(plugins: Sequence[Any], algo: str, **options: Any):
    """``Components`` of the registered algorithm ``algo`` built with ``options`` for its config."""
    dare = build_for(*plugins)
    spec = dare.registries.algorithms.get(algo)
    return spec.build(structure_or_raise(spec.config_cls, options, "algorithm"), ComponentLookup(dare.registries))


def one_rl_step(plugins: Sequence[Any], algo: str, model: str, tmp_path: Any,
                overrides: Sequence[str] = (), gen_length: int = 4, block_length: int = 4) -> dict:
    """:func:`~dare_core.testing.rl_probe.tiny_rl_run` of ``algo`` on ``model`` (a toy family among
    ``plugins``) for one step with micro-batches of 4 and ``gen_length`` tokens sampled at
    temperature 1; returns the step's metrics record."""
    tiny_rl_run(tmp_path, [*plugins, ProbePlugin()], algo, model, steps=1, overrides=[
        "run_name=one_step", "trainer.micro_batch_size=4", f"rollout.gen_length={gen_length}",
        f"rollout.block_length={block_length}", f"rollout.steps={gen_length}", "rollout.temperature=1.0",
        *overrides])
    return json.loads((tmp_path / "one_step" / "metrics.jsonl").read_text().splitlines()[0])


def check_accumulate_matches_backward(components: Any, wrapper: Any, batch: Any, corrupted: Any,
                                      old: torch.Tensor, ref: Optional[torch.Tensor],
                                      advantages: torch.Tensor, scale: float = 0.5):
    """Gradients of ``components.accumulate`` (as the RL loop calls it) equal those of
    ``scale · loss(estimator(all rows))`` with one backward; returns both metric dicts."""
    from dare_core.workflows.rl import _row_estimate

    mask = batch.response_mask.float()
    wrapper.module.zero_grad()
    loss, metrics = components.loss(components.estimator(wrapper, batch, corrupted), old, ref, advantages, mask)
    (loss * scale).backward()
    full = [p.grad.clone() for p in wrapper.module.parameters()]
    wrapper.module.zero_grad()
    loss2, metrics2 = components.accumulate.accumulate(
        _row_estimate(components.estimator, wrapper, batch, corrupted), corrupted.num_samples,
        old, ref, advantages, mask, scale)
    a, b = float(loss.detach()), float(loss2)
    assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (a, b)
    assert any(g.abs().sum() > 0 for g in full), "the loss has no gradient"
    for a, p in zip(full, wrapper.module.parameters()):
        torch.testing.assert_close(p.grad, a, rtol=1e-4, atol=1e-7)
    return metrics, metrics2
