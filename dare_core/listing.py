"""Tables for ``dare list``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dare_core.plugins import Dare


def list_rows(dare: Dare, kind: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    regs = dare.registries
    rows: list[tuple[Any, ...]]  # one table row of the kind's columns
    if kind == "models":
        rows = [
            (
                n,
                s.kind,
                s.block_size or "-",
                ",".join(sorted(s.capabilities)) or "-",
                ",".join(s.rollouts or (s.default_rollout,)),
                s.default_rollout,
                regs.models.owner(n),
            )
            for n, s in regs.models.items()
        ]
        return ("model", "kind", "block", "capabilities", "rollouts", "default rollout", "plugin"), rows
    if kind == "algorithms":
        rows = [
            (
                n,
                s.workflow,
                ",".join(sorted(s.kinds)) or "any",
                ",".join(sorted(s.requires)) or "-",
                " ".join(f"{k}={v if isinstance(v, str) else '|'.join(v)}" for k, v in s.components.items()),
                s.paper,
                regs.algorithms.owner(n),
            )
            for n, s in regs.algorithms.items()
        ]
        return ("algorithm", "workflow", "kinds", "requires", "components", "paper", "plugin"), rows
    if kind == "rollouts":
        rows = [
            (
                n,
                ",".join(sorted(s.kinds)) or "any",
                ",".join(sorted(s.records)) or "-",
                s.description,
                regs.rollouts.owner(n),
            )
            for n, s in regs.rollouts.items()
        ]
        return ("rollout", "kinds", "records", "description", "plugin"), rows
    if kind == "tasks":
        rows = [(n, s.description, regs.tasks.owner(n)) for n, s in regs.tasks.items()]
        return ("task", "description", "plugin"), rows
    if kind == "engines":
        rows = [
            (n, "torchrun" if s.distributed else "-", s.description, regs.engines.owner(n))
            for n, s in regs.engines.items()
        ]
        return ("engine", "launcher", "description", "plugin"), rows
    registry = regs[kind]
    rows = [(n, getattr(s, "description", ""), registry.owner(n)) for n, s in registry.items()]
    return (registry.kind, "description", "plugin"), rows


def supports(algo: Any, family: Any) -> bool:
    if algo.kinds and family.kind not in algo.kinds:
        return False
    return set(algo.requires) <= set(family.capabilities)


def support_matrix(dare: Dare) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    regs = dare.registries
    families = regs.models.names()
    rows = []
    for name, algo in regs.algorithms.items():
        rows.append((name,) + tuple("✓" if supports(algo, regs.models.get(f)) else "–" for f in families))
    return ("algorithm",) + tuple(families), rows
