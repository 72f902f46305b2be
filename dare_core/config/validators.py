"""Small attrs validators with messages meant for users (the config loader prefixes the key)."""

from __future__ import annotations

from typing import Any, Iterable


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def positive(_inst: Any, _attr: Any, value: Any) -> None:
    _check(value is not None and value > 0, f"must be > 0, got {value!r}")


def non_negative(_inst: Any, _attr: Any, value: Any) -> None:
    _check(value is not None and value >= 0, f"must be >= 0, got {value!r}")


def probability(_inst: Any, _attr: Any, value: Any) -> None:
    _check(value is not None and 0.0 <= value <= 1.0, f"must be in [0, 1], got {value!r}")


def optional(validator):
    def check(inst: Any, attr: Any, value: Any) -> None:
        if value is not None:
            validator(inst, attr, value)

    return check


def one_of(choices: Iterable[Any]):
    allowed = tuple(choices)

    def check(_inst: Any, _attr: Any, value: Any) -> None:
        _check(value in allowed, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")

    return check


def in_range(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        ok = (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high
        )
        lb = "(" if low_open else "["
        hb = ")" if high_open else "]"
        _check(ok, f"must be in {lb}{low}, {high}{hb}, got {value!r}")

    return check
