"""Structuring plain dicts into frozen attrs config classes, reporting every problem at once.

cattrs converts the leaves (with strict hooks: no bool where a number is expected, numeric
strings such as ``1e-4`` accepted for floats because YAML 1.1 reads them as strings); this module
walks the attrs classes so that unknown keys, wrong types, failed field validators and failed
cross-field invariants are all collected, with their dotted key paths, into one
:class:`~dare_core.errors.ConfigError`.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Iterable

import attrs
import cattrs

from dare_core.errors import ConfigError


def _strict_float(value: Any, _t: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError
    return float(value)


def _strict_int(value: Any, _t: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError
    return int(value)


def _strict_bool(value: Any, _t: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise TypeError


def _strict_str(value: Any, _t: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise TypeError


converter = cattrs.Converter(forbid_extra_keys=True)
converter.register_structure_hook(float, _strict_float)
converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(bool, _strict_bool)
converter.register_structure_hook(str, _strict_str)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = " or ".join(type_name(a) for a in args)
        return f"{inner} or null" if len(args) < len(typing.get_args(tp)) else inner
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return str(tp).replace("typing.", "") if origin is not None else getattr(tp, "__name__", str(tp))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def structure(cls: type, data: Any, path: str = "", *, extra_keys: Iterable[str] = ()) -> tuple[Any, list[str]]:
    """Structure ``data`` into ``cls``; returns ``(instance or None, problems)``. ``extra_keys``:
    more keys valid at this level that the caller structures itself (e.g. plugin-owned sections):
    skipped here, and offered among the valid keys when a key is unknown."""
    attrs.resolve_types(cls)
    problems: list[str] = []
    where = path or "config"
    data = {} if data is None else data
    if not isinstance(data, dict):
        return None, [f"{where}: expected a mapping, got {data!r}"]
    fields = {f.name: f for f in attrs.fields(cls) if f.init}
    valid = sorted({*fields, *extra_keys})
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
            problems.append(f"{_join(path, str(key))}: unknown key ({hint})")
    kwargs: dict[str, Any] = {}
    broken: set[str] = set()
    for name, field in fields.items():
        key_path = _join(path, name)
        if name not in data:
            if field.default is attrs.NOTHING:
                problems.append(f"{key_path}: missing required key")
                broken.add(name)
            continue
        value = data[name]
        ftype = field.type
        if attrs.has(ftype):
            sub, sub_problems = structure(ftype, value, key_path)
            problems.extend(sub_problems)
            if sub is None:
                broken.add(name)
                continue
            value = sub
        elif ftype is not None and ftype is not Any:
            try:
                value = converter.structure(value, ftype)
            except Exception:
                problems.append(f"{key_path}: expected {type_name(ftype)}, got {value!r}")
                broken.add(name)
                continue
        kwargs[name] = value
    problems.extend(_validate(fields, kwargs, broken, path))
    if problems:
        return None, problems
    try:
        with attrs.validators.disabled():
            obj = cls(**kwargs)
    except (ValueError, TypeError) as exc:
        return None, [f"{where}: {exc}"]
    return obj, []


def _validate(fields: dict[str, Any], kwargs: dict[str, Any], broken: set[str], path: str) -> list[str]:
    """Run the field validators of every well-typed field (defaults included) on a stand-in
    instance holding all well-typed values, so validators reading other fields (``self.other``)
    work and every failure is reported; one reading a field that failed to structure is skipped."""
    view = types.SimpleNamespace()
    for name, field in fields.items():
        if name in broken:
            continue
        value = kwargs.get(name, field.default)
        if isinstance(value, attrs.Factory):  # type: ignore[arg-type]  # a class the attrs stubs type as a function
            value = value.factory(view) if value.takes_self else value.factory()
        setattr(view, name, value)
    problems: list[str] = []
    for name, field in fields.items():
        if field.validator is None or name in broken:
            continue
        try:
            field.validator(view, field, getattr(view, name))
        except (ValueError, TypeError) as exc:  # validators name their field for direct callers
            problems.append(f"{_join(path, name)}: {str(exc).removeprefix(name + ' ')}")
        except AttributeError:
            if not broken:
                raise
    return problems


def structure_or_raise(cls: type, data: Any, path: str = "") -> Any:
    obj, problems = structure(cls, data, path)
    if problems:
        raise ConfigError(problems)
    return obj


def unstructure(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) of a config instance."""
    if attrs.has(type(obj)):
        return {f.name: unstructure(getattr(obj, f.name)) for f in attrs.fields(type(obj))}
    if isinstance(obj, (list, tuple)):
        return [unstructure(v) for v in obj]
    if isinstance(obj, (set, frozenset)):  # YAML has no set type; sorted for stable files
        return [unstructure(v) for v in sorted(obj, key=repr)]
    return {k: unstructure(v) for k, v in obj.items()} if isinstance(obj, dict) else obj
