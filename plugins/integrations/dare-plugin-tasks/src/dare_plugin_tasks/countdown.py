"""Countdown: reach a target with +, -, *, / using each of three numbers once.

Eval = the real test items (``data/countdown_test.parquet``, 256 items, three numbers each).
Train = the bundled train split (``data/countdown_train.parquet``, 20,000 items, three or four
numbers each, no reference responses), or with ``task.train_path=generated`` generated items
shaped like the eval items (three numbers drawn uniformly from 1..100, repeats allowed; a target
in 1..100 that some expression reaches; a reference response each), none of which is an eval item.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Iterable, Optional, Union

from dare_core.api import DareError, Example, TaskConfig
from dare_plugin_tasks._base import FileBackedTask
from dare_plugin_tasks.rewards import evaluate_equation

__all__ = [
    "COUNTDOWN_PROMPT",
    "COUNTDOWN_REASONING",
    "CountdownTask",
    "countdown_example",
    "countdown_prompt",
    "countdown_reference_response",
    "generate_countdown",
    "solve_countdown",
]

COUNTDOWN_PROMPT = (
    "Respond in the following format:\n"
    "<reasoning>\n...\n</reasoning>\n"
    "<answer>\n...\n</answer>\n\n"
    "Using only the numbers {numbers}, create an arithmetic expression that evaluates to exactly "
    "{target}. You must use all numbers from the list, and each number must be used exactly once. "
    "You may use the operations +, -, *, and / as needed. After reasoning, provide only your "
    "final expression inside <answer></answer> tags without including an equals sign or the "
    "target number. For example, if the numbers are [2, 3, 4] and the target is 5, a valid "
    "answer is: <answer>\n2*4-3\n</answer>"
)

COUNTDOWN_REASONING = "Combine the numbers."

DEFAULT_TRAIN_SIZE = 20000
NUMBER_RANGE = (1, 100)
TARGET_RANGE = (1, 100)

# an expression: (value, text, precedence) with precedence 3 = atom, 2 = * /, 1 = + -
_Expr = tuple[int, str, int]


def countdown_prompt(numbers: list[int], target: int) -> list[dict[str, str]]:
    """The chat messages of the real data for ``numbers`` and ``target``."""
    content = COUNTDOWN_PROMPT.format(numbers=json.dumps(list(numbers)), target=target)
    return [{"role": "user", "content": content}]


def countdown_reference_response(expression: str) -> str:
    """The supervised target: short fixed reasoning, then the expression."""
    return f"<reasoning>\n{COUNTDOWN_REASONING}\n</reasoning>\n<answer>\n{expression}\n</answer>"


def _paren(e: _Expr, needed: bool) -> str:
    return f"({e[1]})" if needed else e[1]


def _combine(a: _Expr, b: _Expr) -> list[_Expr]:
    """``a op b`` for every op keeping intermediate values non-negative integers."""
    out = [(a[0] + b[0], f"{a[1]}+{b[1]}", 1)]
    if a[0] >= b[0]:
        out.append((a[0] - b[0], f"{a[1]}-{_paren(b, b[2] == 1)}", 1))
    out.append((a[0] * b[0], f"{_paren(a, a[2] == 1)}*{_paren(b, b[2] == 1)}", 2))
    if b[0] != 0 and a[0] % b[0] == 0:
        out.append((a[0] // b[0], f"{_paren(a, a[2] == 1)}/{_paren(b, b[2] <= 2)}", 2))
    return out


def _all_expressions(items: list[_Expr]) -> Iterable[_Expr]:
    if len(items) == 1:
        yield items[0]
        return
    for i, j in itertools.permutations(range(len(items)), 2):
        rest = [items[k] for k in range(len(items)) if k not in (i, j)]
        for combined in _combine(items[i], items[j]):
            yield from _all_expressions(rest + [combined])


def solve_countdown(numbers: list[int]) -> dict[int, str]:
    """Every value reachable using all ``numbers`` once (integer, non-negative intermediate
    results) → its shortest expression (ties: lexicographically first)."""
    best: dict[int, str] = {}
    for value, text, _ in _all_expressions([(n, str(n), 3) for n in numbers]):
        cur = best.get(value)
        if cur is None or (len(text), text) < (len(cur), cur):
            best[value] = text
    return best


def countdown_example(
    numbers: list[int],
    target: int,
    index: int,
    split: str = "train",
    expression: Optional[str] = None,
) -> Example:
    """An :class:`Example` in the real data's layout (reference response if ``expression``)."""
    return Example(
        prompt=countdown_prompt(numbers, target),
        ground_truth=str(target),
        data_source="countdown",
        extra_info={"index": index, "numbers": json.dumps(list(numbers)), "split": split, "task": "math"},
        response=None if expression is None else countdown_reference_response(expression),
    )


def _item_key(numbers: Iterable[int], target: Union[int, str]) -> tuple[tuple[int, ...], int]:
    return tuple(sorted(int(n) for n in numbers)), int(target)


def generate_countdown(
    n: int,
    seed: Union[int, str] = 0,
    *,
    count: int = 3,
    exclude: Iterable[tuple[tuple[int, ...], int]] = (),
    split: str = "train",
) -> list[Example]:
    """``n`` distinct solvable items with ``count`` numbers, deterministic for ``seed``.

    ``exclude`` holds ``(sorted numbers, target)`` keys that must not be produced. Each item
    has a reference response whose expression uses every number once and equals the target.
    """
    if not 2 <= count <= 4:
        raise DareError(f"countdown uses 2 to 4 numbers, got {count}")
    rng = random.Random(f"countdown:{seed}")
    seen = set(exclude)
    out: list[Example] = []
    misses = 0
    lo, hi = NUMBER_RANGE
    while len(out) < n:
        numbers = [rng.randint(lo, hi) for _ in range(count)]
        solutions = solve_countdown(numbers)
        targets = sorted(t for t in solutions if TARGET_RANGE[0] <= t <= TARGET_RANGE[1])
        target = rng.choice(targets) if targets else None
        if target is None or _item_key(numbers, target) in seen:
            misses += 1
            if misses > 1000 + 50 * n:
                raise DareError(f"could not generate {n} distinct countdown items")
            continue
        expression = solutions[target]
        value = evaluate_equation(expression)
        if value is None or abs(value - target) >= 1e-9:  # guards the printer; never expected
            raise AssertionError(f"countdown printer produced {expression!r} != {target}")
        seen.add(_item_key(numbers, target))
        out.append(countdown_example(numbers, target, len(out), split, expression))
    return out


class CountdownTask(FileBackedTask):
    """Countdown with three numbers (reward of arXiv:2504.12216: 1.0 / 0.1 format credit / 0).

    ``examples("eval")``: the real test items (or ``config.eval_path``).
    ``examples("train")``: ``config.train_path`` if set, else the bundled train split. With
    ``train_path=generated``: ``limit`` (default 20000) generated items, deterministic for
    ``(config.seed, seed)``, excluding every eval item.
    """

    name = "countdown"
    default_eval_file = "countdown_test.parquet"
    default_train_file = "countdown_train.parquet"
    generates = True

    def __init__(self, config: Optional[TaskConfig] = None, *, count: int = 3):
        super().__init__(config)
        if not 2 <= count <= 4:
            raise DareError(f"countdown uses 2 to 4 numbers, got {count}")
        self.count = count

    def _generate_train(self, limit: Optional[int], seed: int) -> list[Example]:
        n = DEFAULT_TRAIN_SIZE if limit is None else limit
        exclude = set()
        for ex in self.eval_set():
            numbers = ex.extra_info.get("numbers")
            if numbers is not None:
                parsed = json.loads(numbers) if isinstance(numbers, str) else numbers
                exclude.add(_item_key(parsed, ex.ground_truth))
        return generate_countdown(n, seed=f"{self.config.seed}:{seed}", count=self.count, exclude=exclude)
