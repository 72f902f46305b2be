"""Tables for ``dare list``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dare_core.plugins import Dare


def marked(text: str, example: bool) -> str:
    """``text`` as listings show it: ``(example)`` after it when an example distribution gave it."""
    return f"{text} (example)" if example else text


def _owner(examples: set[str], registry: Any, name: str) -> str:
    """The plugin that registered ``name``, marked when its distribution is an example."""
    owner = registry.owner(name)
    return marked(owner, owner in examples)


def list_rows(dare: Dare, kind: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    regs, examples = dare.registries, dare.examples()
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
                _owner(examples, regs.models, n),
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
                _owner(examples, regs.algorithms, n),
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
                _owner(examples, regs.rollouts, n),
            )
            for n, s in regs.rollouts.items()
        ]
        return ("rollout", "kinds", "records", "description", "plugin"), rows
    if kind == "tasks":
        rows = [(n, s.description, _owner(examples, regs.tasks, n)) for n, s in regs.tasks.items()]
        return ("task", "description", "plugin"), rows
    if kind == "engines":
        rows = [
            (n, "torchrun" if s.distributed else "-", s.description, _owner(examples, regs.engines, n))
            for n, s in regs.engines.items()
        ]
        return ("engine", "launcher", "description", "plugin"), rows
    registry = regs[kind]
    rows = [(n, getattr(s, "description", ""), _owner(examples, registry, n)) for n, s in registry.items()]
    return (registry.kind, "description", "plugin"), rows


def supports(algo: Any, family: Any) -> bool:
    kind_fits = not algo.kinds or family.kind in algo.kinds
    return kind_fits and set(algo.requires) <= set(family.capabilities)


def support_matrix(dare: Dare) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    regs = dare.registries
    families = regs.models.names()
    rows = []
    examples = dare.examples()
    for name, algo in regs.algorithms.items():
        shown = marked(name, regs.algorithms.owner(name) in examples)
        rows.append((shown,) + tuple("✓" if supports(algo, regs.models.get(f)) else "–" for f in families))
    return ("algorithm",) + tuple(families), rows


def fit_matrix(dare: Dare) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Which bundled checkpoints fit which tasks' held-out prompts under ``dare eval``: one row
    per task, one column per family with a bundled checkpoint; ``✓`` fits, ``✗ N > C`` the
    longest prompt (and the generation, against the model's context) exceeds the limit ``C``,
    ``–`` the task has no bundled held-out set (it needs ``task.eval_path``)."""
    from dare_core.config import resolve
    from dare_core.errors import DareError, PromptFitError
    from dare_core.preflight import preflight

    regs = dare.registries
    families = [n for n, f in regs.models.items() if f.default_checkpoint]
    rows = []
    for task in regs.tasks.names():
        cells = []
        for family in families:
            try:
                config = resolve(dare, model=family, need_algo=False, overrides=[f"task.name={task}"])
                preflight(dare, config, evaluation=True)
                cells.append("✓")
            except PromptFitError as exc:
                cells.append(f"✗ {exc.longest} > {exc.limit}")
            except DareError:  # no held-out set of its own
                cells.append("–")
        rows.append((task, *cells))
    return ("task", *families), rows
