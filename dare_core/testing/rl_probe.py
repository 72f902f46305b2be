"""Helpers for testing RL algorithms end to end on the family-free toy models: a learnable
``parity`` task (:class:`ProbePlugin`), tiny runs, and spies (:func:`spy_algorithm`) that check
that one rollout batch uses one set of masks for old, reference and new log-likelihoods.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs
import torch

from dare_core.interfaces import AlgorithmSpec, Corrupted, Example, RLComponents, Score, TaskSpec
from dare_core.plugins import hookimpl


class ParityTask:
    """Prompt ``n<k>``; reward = fraction of response characters with an even code point (about
    half of any random response, so a group's rewards almost never tie); acc = all of them."""

    name = "parity"

    def __init__(self, cfg: Any = None):
        self.cfg = cfg

    def examples(self, split: str, limit: Optional[int] = None, seed: int = 0) -> list[Example]:
        n = limit or 64
        off = 0 if split == "train" else 1000
        return [Example([{"role": "user", "content": f"n{(i + off) % 10}"}], "0", "parity") for i in range(n)]

    def score(self, example: Example, response: str) -> Score:
        even = sum(ord(c) % 2 == 0 for c in response) / max(1, len(response))
        return Score(even, float(len(response) > 0 and even == 1.0), response)


class ProbePlugin:
    """Registers :class:`ParityTask` and the given algorithm specs (e.g. spies)."""

    def __init__(self, *specs: AlgorithmSpec):
        self.specs = specs

    @hookimpl
    def dare_register_tasks(self, register):
        register(TaskSpec("parity", ParityTask, "characters with even code points (test task)"))

    @hookimpl
    def dare_register_algorithms(self, register):
        for spec in self.specs:
            register(spec)


def _rows_of(corrupted: Corrupted) -> set[bytes]:
    """Fingerprints of every (row, sequence) state and target set of a corruption."""
    M, B, _ = corrupted.noisy_ids.shape
    return {
        corrupted.noisy_ids[m, b].cpu().numpy().tobytes() + corrupted.masked[m, b].cpu().numpy().tobytes()
        for m in range(M)
        for b in range(B)
    }


@attrs.define
class SpyLog:
    """What a spied run did, in order: ``("draw", rows)`` for every drawn corruption or expanded
    trajectory, ``("estimate", grad_enabled, rows)`` for every estimator call (``rows`` are
    fingerprints of the states and targets used)."""

    events: list[tuple] = attrs.field(factory=list)

    @property
    def draws(self) -> list[set[bytes]]:
        return [e[1] for e in self.events if e[0] == "draw"]


class _Spy:
    def __init__(self, inner: Any, log: SpyLog, role: str):
        self._inner, self._log, self._role = inner, log, role

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner(*args, **kwargs)
        if self._role == "corruption":
            self._log.events.append(("draw", _rows_of(out)))
        else:
            corrupted = args[2] if len(args) > 2 else kwargs.get("corrupted")
            if corrupted is not None:
                self._log.events.append(("estimate", torch.is_grad_enabled(), _rows_of(corrupted)))
        return out

    def rows(self, *args: Any, **kwargs: Any) -> Any:
        rows = self._inner.rows(*args, **kwargs)
        if rows.corrupted is not None:
            self._log.events.append(("draw", _rows_of(rows.corrupted)))
        return rows


def spy_algorithm(spec: AlgorithmSpec, name: Optional[str] = None) -> tuple[AlgorithmSpec, SpyLog]:
    """``(spy_spec, log)``: ``spy_spec`` builds ``spec``'s components wrapped by recorders."""
    log = SpyLog()

    def build(cfg: Any, lookup: Any):
        comps = spec.build(cfg, lookup)
        changes: dict[str, Any] = {"estimator": _Spy(comps.estimator, log, "estimator")}
        if comps.corruption is not None:
            changes["corruption"] = _Spy(comps.corruption, log, "corruption")
        if isinstance(comps, RLComponents) and comps.trajectory is not None:
            changes["trajectory"] = _Spy(comps.trajectory, log, "trajectory")
        return attrs.evolve(comps, **changes)

    return attrs.evolve(spec, name=name or f"spy_{spec.name}", build=build), log


def assert_one_draw_per_batch(log: SpyLog, steps: int) -> None:
    """Exactly one corruption draw (or trajectory expansion) per rollout batch, and every
    estimator call after it — old, reference and new log-likelihoods — used states of that draw;
    each batch saw at least one call without and one with gradients."""
    draws = log.draws
    assert len(draws) == steps, f"{len(draws)} corruption draws for {steps} rollout batches"
    current: Optional[set[bytes]] = None
    seen: list[set[bool]] = []
    for event in log.events:
        if event[0] == "draw":
            current = event[1]
            seen.append(set())
            continue
        _, grad, rows = event
        assert current is not None, "an estimator call came before any draw"
        assert rows <= current, "an estimator call used states that were not drawn for its batch"
        seen[-1].add(bool(grad))
    assert all(s == {True, False} for s in seen), f"old/new log-likelihood calls per batch: {seen}"


def components_of(plugin: Any, algorithm: str, **options: Any):
    """:func:`~dare_core.testing.algorithm_checks.algorithm_components` of ``plugin``'s ``algorithm``."""
    from dare_core.testing.algorithm_checks import algorithm_components

    return algorithm_components((plugin,), algorithm, **options)


def tiny_rl_run(tmp_path: Any, plugins: list, algo: str, model: str = "toy", overrides=(), steps: int = 2) -> dict:
    """Train ``algo`` for ``steps`` tiny steps on the ``parity`` task (no evaluation, nothing
    saved): 2 prompts x 4 rollouts, micro-batches of 3. ``plugins`` must include a
    :class:`ProbePlugin` and the model family."""
    from dare_core.config import resolve
    from dare_core.testing.registries import build_for
    from dare_core.train import train

    dare = build_for(*plugins)
    cfg = resolve(
        dare,
        algo=algo,
        model=model,
        overrides=[
            "task.name=parity",
            "task.num_eval=8",
            "eval.before=false",
            "eval.after=false",
            "progress=false",
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=r",
            f"trainer.steps={steps}",
            "trainer.batch_size=2",
            "trainer.group_size=4",
            "trainer.micro_batch_size=3",
            "trainer.save_final=false",
            *overrides,
        ],
    )
    return train(dare, cfg)


def spy_run(tmp_path: Any, plugin: Any, algorithm: str, family: Any, overrides=(), steps: int = 2) -> SpyLog:
    """:func:`tiny_rl_run` of a spy of ``algorithm``; returns its :class:`SpyLog`."""
    from dare_core.testing.registries import build_for

    base = build_for(plugin)
    spy, log = spy_algorithm(base.registries.algorithms.get(algorithm))
    tiny_rl_run(tmp_path, [family, plugin, ProbePlugin(spy)], spy.name, overrides=overrides, steps=steps)
    return log
