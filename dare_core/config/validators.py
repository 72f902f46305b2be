"""Small attrs validators with messages meant for users.

Messages start with the field name (``"lr must be > 0, got -1"``) so a config class constructed
directly explains itself; the config structurer replaces the name with the full dotted key.
"""

from __future__ import annotations

import math
from typing import Any, Iterable


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(_inst: Any, attr: Any, value: Any) -> None:
    _check(_real(value) and value > 0, f"{attr.name} must be > 0, got {value!r}")


def non_negative(_inst: Any, attr: Any, value: Any) -> None:
    _check(_real(value) and value >= 0, f"{attr.name} must be >= 0, got {value!r}")


def probability(_inst: Any, attr: Any, value: Any) -> None:
    _check(_real(value) and 0.0 <= value <= 1.0, f"{attr.name} must be in [0, 1], got {value!r}")


def optional(validator):
    def check(inst: Any, attr: Any, value: Any) -> None:
        if value is not None:
            validator(inst, attr, value)

    return check


def one_of(choices: Iterable[Any]):
    allowed = tuple(choices)

    def check(_inst: Any, attr: Any, value: Any) -> None:
        _check(value in allowed, f"{attr.name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")

    return check


def in_range(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    def check(_inst: Any, attr: Any, value: Any) -> None:
        if not _real(value):
            raise ValueError(f"{attr.name} must be a finite number, got {value!r}")
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        lb = "(" if low_open else "["
        hb = ")" if high_open else "]"
        _check(ok, f"{attr.name} must be in {lb}{low}, {high}{hb}, got {value!r}")

    return check


def divides(field: str):
    """A positive integer that divides the (integer) field ``field`` of the same config."""

    def check(inst: Any, attr: Any, value: Any) -> None:
        total = getattr(inst, field)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1 and total % value == 0
        _check(
            ok,
            f"{attr.name} must be a positive divisor of {field}={total}, got {value!r}; "
            f"set {attr.name} to {field} or a divisor of it",
        )

    return check
