"""Reusable checks for algorithm plugin tests: build an algorithm's components from options, run
one RL step through the core loop on a toy family, and check that a loss's Monte-Carlo
accumulation (``RLComponents.accumulate``) gives the gradient of one backward over all rows, and
that the gradient of a mini-batch does not depend on how it is split into micro-batches and
ranks."""

from __future__ import annotations

import importlib
import json
import types
from typing import Any, Optional, Sequence

import attrs
import torch

from dare_core.config.structure import structure_or_raise
from dare_core.testing.registries import build_for
from dare_core.testing.rl_probe import ProbePlugin, tiny_rl_run
from dare_core.workflows.runtime import build_components


def algorithm_components(plugins: Sequence[Any], algo: str, **options: Any):
    """The components of the registered algorithm ``algo`` built with ``options`` for its config,
    as its workflow runs them (:func:`~dare_core.workflows.runtime.build_components`)."""
    dare = build_for(*plugins)
    spec = dare.registries.algorithms.get(algo)
    config = structure_or_raise(spec.config_cls, options, "algorithm")
    return build_components(dare, spec, config)


def one_rl_step(
    plugins: Sequence[Any],
    algo: str,
    model: str,
    tmp_path: Any,
    overrides: Sequence[str] = (),
    gen_length: int = 4,
    block_length: int = 4,
) -> dict:
    """:func:`~dare_core.testing.rl_probe.tiny_rl_run` of ``algo`` on ``model`` (a toy family among
    ``plugins``) for one step with micro-batches of 4 and ``gen_length`` tokens sampled at
    temperature 1; returns the step's metrics record."""
    tiny_rl_run(
        tmp_path,
        [*plugins, ProbePlugin()],
        algo,
        model,
        steps=1,
        overrides=[
            "run_name=one_step",
            "trainer.micro_batch_size=4",
            f"rollout.gen_length={gen_length}",
            f"rollout.block_length={block_length}",
            f"rollout.steps={gen_length}",
            "rollout.temperature=1.0",
            *overrides,
        ],
    )
    return json.loads((tmp_path / "one_step" / "metrics.jsonl").read_text().splitlines()[0])


def check_accumulate_matches_backward(
    components: Any,
    wrapper: Any,
    batch: Any,
    corrupted: Any,
    old: torch.Tensor,
    ref: Optional[torch.Tensor],
    advantages: torch.Tensor,
):
    """Gradients of ``components.accumulate`` (as the RL loop calls it) equal those of
    ``0.5 · loss(estimator(all rows))`` with one backward; returns both metric dicts."""
    scale = 0.5
    from dare_core.workflows.rl import _row_estimate

    mask = batch.response_mask.float()
    wrapper.module.zero_grad()
    loss, metrics = components.loss(components.estimator(wrapper, batch, corrupted), old, ref, advantages, mask)
    (loss * scale).backward()
    full = [p.grad.clone() for p in wrapper.module.parameters()]
    wrapper.module.zero_grad()
    loss2, metrics2 = components.accumulate.accumulate(
        _row_estimate(components.estimator, wrapper, batch, corrupted),
        corrupted.num_samples,
        old,
        ref,
        advantages,
        mask,
        scale,
    )
    a, b = float(loss.detach()), float(loss2)
    assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (a, b)
    assert any(g.abs().sum() > 0 for g in full), "the loss has no gradient"
    for a, p in zip(full, wrapper.module.parameters()):
        torch.testing.assert_close(p.grad, a, rtol=1e-4, atol=1e-7)
    return metrics, metrics2


AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: response lengths of the 4 toy rows (rows of different lengths)
LENGTHS = (8, 5, 2, 7)
TOY = "dare_core.testing.toy:make_toy_wrapper"


def _options(plugins: Sequence[Any], algo: str) -> list[dict]:
    """One option set per ``loss_agg_mode`` where the algorithm's config has it, else the defaults."""
    spec = build_for(*plugins).registries.algorithms.get(algo)
    has_agg = "loss_agg_mode" in attrs.fields_dict(spec.config_cls)
    return [{"loss_agg_mode": m} for m in AGG_MODES] if has_agg else [{}]


def partition_gradient(
    plugins: Sequence[Any], algo: str, options: dict, micro: int, engine: Any = None, toy: str = TOY
) -> list[torch.Tensor]:
    """The gradient of one mini-batch of 4 toy rows (lengths :data:`LENGTHS`, float64) through
    the update's :func:`~dare_core.workflows.update.backward_minibatch` with the RL objective (old
    log-likelihoods off the policy, so ratios and clips are active) or the supervised one, in
    micro-batches of ``micro``; under a multi-process ``engine`` this rank takes its
    contiguous share of the rows and the gradients are averaged over ranks as the engine's step
    does. ``toy``: ``"module:function"`` making the toy wrapper."""
    from dare_core.interfaces import UpdateObjective
    from dare_core.testing.contracts import _corrupted, toy_rows
    from dare_core.workflows.rl import PolicyObjective, rows_update_batch
    from dare_core.workflows.sft import SupervisedObjective
    from dare_core.workflows.update import UpdatePlan, backward_minibatch

    comps = algorithm_components(plugins, algo, **options)
    module, name = toy.split(":")
    wrapper = getattr(importlib.import_module(module), name)()
    wrapper.module.double()
    spec = build_for(*plugins).registries.algorithms.get(algo)
    rows = toy_rows(plugins, algo, comps, wrapper, LENGTHS, structure_or_raise(spec.config_cls, options, "algorithm"))
    corrupted = _corrupted(comps, wrapper, rows)
    world, rank = (engine.world_size, engine.rank) if engine is not None else (1, 0)
    n = rows.batch.batch_size // world
    mine = torch.arange(rank * n, (rank + 1) * n)
    objective: UpdateObjective
    if build_for(*plugins).registries.algorithms.get(algo).workflow == "sft":
        objective, part = SupervisedObjective(comps, wrapper, engine), rows_update_batch(rows, corrupted)
    else:
        with torch.no_grad():
            old = comps.estimator(wrapper, rows.batch, corrupted)
        g = torch.Generator().manual_seed(1)
        old = old + 0.3 * torch.randn(old.shape, generator=g, dtype=old.dtype)
        ref = old + 0.1 * torch.randn(old.shape, generator=g, dtype=old.dtype) if comps.needs_ref else None
        objective, part = PolicyObjective(comps, wrapper, engine), rows_update_batch(rows, corrupted, old, ref)
    backward_minibatch(engine, objective, part.select(mine), UpdatePlan(micro_batch=micro))
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in wrapper.module.parameters()]
    if world > 1:
        flat = torch.cat([x.reshape(-1) for x in grads])
        torch.distributed.all_reduce(flat)
        grads = list((flat / world).split([x.numel() for x in grads]))
    return [x.reshape(-1) for x in grads]


def _ranks_gradients(refs: list[Any], algo: str, option_sets: list[dict], micro: int, toy: str) -> list:
    """In a gloo rank: :func:`partition_gradient` under the ``ddp`` engine for every option set."""
    from dare_core.config import RunConfig
    from dare_core.engines.distributed import ProcessGroupEngine

    plugins = [importlib.import_module(r) if isinstance(r, str) else r for r in refs]
    cfg = RunConfig()
    engine = ProcessGroupEngine(
        attrs.evolve(
            cfg,
            model=attrs.evolve(cfg.model, device="cpu"),
            engine=attrs.evolve(cfg.engine, name="ddp", precision="fp32"),
        )
    )
    try:
        return [partition_gradient(plugins, algo, o, micro, engine, toy) for o in option_sets]
    finally:
        engine.close()


def check_partition_invariance(plugins: Sequence[Any], algo: str, tol: float = 1e-6, toy: str = TOY) -> None:
    """The mini-batch gradient of ``algo`` is the same (max difference ``≤ tol·max(1, max|g|)``)
    with micro-batches of 1, 2 and all 4 rows and on 2 gloo ranks (``ddp``, one spawn for every
    ``loss_agg_mode`` the algorithm offers); ``toy`` as in :func:`partition_gradient`."""
    from dare_core.testing.distributed import run_ranks

    option_sets = _options(plugins, algo)
    whole = [partition_gradient(plugins, algo, o, 4, toy=toy) for o in option_sets]
    refs = [p.__name__ if isinstance(p, types.ModuleType) else p for p in plugins]  # picklable
    ranks = run_ranks(2, _ranks_gradients, refs, algo, option_sets, 1, toy)[0]
    for o, full, two in zip(option_sets, whole, ranks):
        assert any(bool(x.abs().sum() > 0) for x in full), f"{algo} {o}: the loss has no gradient"
        for name, parts in [
            ("micro 1", partition_gradient(plugins, algo, o, 1, toy=toy)),
            ("micro 2", partition_gradient(plugins, algo, o, 2, toy=toy)),
            ("2 ranks", two),
        ]:
            scale = max(1.0, max(float(x.abs().max()) for x in full))
            diff = max(float((a - b).abs().max()) for a, b in zip(full, parts))
            assert diff <= tol * scale, f"{algo} {o}: {name} gradient differs from the whole mini-batch's by {diff:.3g}"
