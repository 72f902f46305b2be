"""The hook specs document their call semantics, their ``register`` callbacks are typed per hook,
and the docs (``docs/hooks.md``, ``docs/plugin-guide.md``) list exactly the hooks, callback types
and spec fields the code has."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import typing

import attrs
import pytest

import dare_core.hookspecs as hookspecs
import dare_core.interfaces as interfaces
from dare_core.plugins import REGISTRATION_HOOKS

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOKS_MD = (ROOT / "docs" / "hooks.md").read_text()
GUIDE_MD = (ROOT / "docs" / "plugin-guide.md").read_text()

#: what ``AlgorithmSpec`` holds and ``AlgorithmSpec.build`` returns, documented like the specs
NESTED_SPECS = ("RolloutNeeds", "Components", "RLComponents", "SFTComponents", "PreferenceComponents")


def _specs() -> dict[str, typing.Callable]:
    return {n: f for n, f in vars(hookspecs).items() if inspect.isfunction(f) and hasattr(f, "dare_spec")}


def _registry_types() -> dict[str, str]:
    """Registry attribute -> the spec class it holds, read from ``Registries.__init__``
    (``self.models: Registry[ModelFamily] = ...``)."""
    tree = ast.parse((ROOT / "dare_core" / "registry.py").read_text())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute):
            ann = node.annotation
            if isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "Registry":
                out[node.target.attr] = ann.slice.id
    return out


def _callback_spec(alias_name: str) -> str:
    """``RegisterFamily`` -> ``ModelFamily``: the one argument of the callback type."""
    alias = getattr(hookspecs, alias_name)
    assert typing.get_origin(alias) is typing.get_origin(typing.Callable[[int], None]), alias_name
    args, ret = typing.get_args(alias)
    assert ret is type(None) and len(args) == 1, f"{alias_name} is not Callable[[Spec], None]"
    return args[0].__forward_arg__ if isinstance(args[0], typing.ForwardRef) else args[0].__name__


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of ``text``: (header cells, body rows of cells)."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$", lines[i + 1]):
            header, rows, i = _cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _table(text: str, header_start: list[str], after: str = "") -> list[list[str]]:
    """The body of the first table whose header starts with ``header_start`` (after the text
    ``after``, if given)."""
    found = [
        rows
        for head, rows in _tables(text[text.index(after) :] if after else text)
        if head[: len(header_start)] == header_start
    ]
    assert found, f"no table with header {header_start}"
    return found[0]


def _code(cell: str) -> str:
    """The text of a cell that is one backticked span."""
    m = re.fullmatch(r"`([^`]*)`", cell)
    assert m, f"expected one `code` span, got {cell!r}"
    return m.group(1)


# ----------------------------------------------------------------------------- hook specs
@pytest.mark.parametrize("name", sorted(_specs()))
def test_hookspec_docstring_gives_params_return_and_call_semantics(name):
    fn = _specs()[name]
    doc = " ".join((inspect.getdoc(fn) or "").split())
    for param, p in inspect.signature(fn).parameters.items():
        assert f":param {param}:" in doc, f"{name}: no ':param {param}:'"
        assert p.annotation not in (inspect.Parameter.empty, "Any"), f"{name}: {param} is not typed"
    assert ":return:" in doc, f"{name}: no ':return:' line"
    assert re.search(r"\b[Cc]alled (once|by)\b", doc), f"{name}: no sentence saying who calls it, when"
    assert "Every implementation is called" in doc, f"{name}: does not say which implementations run"
    assert re.search(r"registration order|pluggy's order", doc), f"{name}: does not say in which order"
    assert re.search(r"exception|raises", doc), f"{name}: does not say what an exception does"
    if fn.dare_spec.get("historic"):
        assert doc.count("Historic") == 1, f"{name} is historic: say so"


def test_registration_hooks_are_specified_in_build_order():
    specs = [n for n in _specs() if n in REGISTRATION_HOOKS]
    assert specs == list(REGISTRATION_HOOKS), "hookspecs.py and plugins.REGISTRATION_HOOKS list them in another order"


@pytest.mark.parametrize("name", list(REGISTRATION_HOOKS))
def test_register_is_typed_with_the_spec_its_registry_holds(name):
    param = inspect.signature(_specs()[name]).parameters["register"]
    alias = param.annotation
    assert alias != "Register" and alias.startswith("Register"), f"{name}: register is typed {alias!r}"
    spec = _callback_spec(alias)
    assert spec == _registry_types()[REGISTRATION_HOOKS[name]]
    assert hasattr(interfaces, spec)
    assert re.search(rf"``register\(\w+: {spec}\) -> None``", inspect.getdoc(_specs()[name])), (
        f"{name}: the docstring does not show register({spec.lower()}: {spec})"
    )


# ----------------------------------------------------------------------------- docs/hooks.md
def test_hooks_md_has_a_section_per_hook_with_its_signature():
    for name, fn in _specs().items():
        params = ", ".join(inspect.signature(fn).parameters)
        assert f"### `{name}({params})`" in HOOKS_MD, f"docs/hooks.md: no section '### `{name}({params})`'"


def test_hooks_md_registration_table_matches_the_code():
    rows = _table(HOOKS_MD, ["hook", "`register` type"])
    seen = {}
    for hook, alias, spec, registry in rows:
        seen[_code(hook)] = (_code(alias), spec.split(" → ")[0], _code(registry))
    assert list(seen) == list(REGISTRATION_HOOKS), f"docs/hooks.md registration table lists {list(seen)}"
    for name, (alias, spec, registry) in seen.items():
        assert alias == inspect.signature(_specs()[name]).parameters["register"].annotation, name
        assert _code(spec) == _callback_spec(alias), name
        assert registry == REGISTRATION_HOOKS[name], name


def test_hooks_md_call_semantics_table_covers_every_hook():
    rows = _table(HOOKS_MD, ["hook", "called by", "when, how often", "implementations called", "order"])
    first = [r[0] for r in rows]
    assert first[0] == f"`dare_register_*` ({len(REGISTRATION_HOOKS)} hooks, below)"
    others = [n for n in _specs() if n not in REGISTRATION_HOOKS]
    named = [re.match(r"`(\w+)`", c).group(1) for c in first[1:]]
    assert named == others, f"docs/hooks.md call-semantics table: {named} != {others}"
    for name in others:
        historic = bool(_specs()[name].dare_spec.get("historic"))
        row = first[1 + others.index(name)]
        assert ("(historic)" in row) == historic, f"{name}: historic is {historic}"


def _bullet(text: str, cls: str) -> str:
    start = text.index(f"- **`{cls}`** —")
    end = min(i for i in (text.find("\n- **", start + 1), text.find("\n### ", start + 1), len(text)) if i > 0)
    return text[start:end]


@pytest.mark.parametrize("cls", sorted(set(_registry_types().values())) + list(NESTED_SPECS))
def test_hooks_md_names_every_spec_field(cls):
    block = _bullet(HOOKS_MD[HOOKS_MD.index("## Registered specs") :], cls)
    missing = [f.name for f in attrs.fields(getattr(interfaces, cls)) if not re.search(rf"`{f.name}[`(]", block)]
    assert not missing, f"docs/hooks.md, Registered specs, {cls}: fields not named: {missing}"


# ----------------------------------------------------------------------------- docs/plugin-guide.md
def test_plugin_guide_hook_table_matches_the_code():
    rows = _table(GUIDE_MD, ["hook", "its argument", "registers"])
    seen = {_code(r[0]): r for r in rows}
    expected = list(REGISTRATION_HOOKS) + ["dare_register_commands"]
    assert list(seen) == expected, f"docs/plugin-guide.md hook table lists {list(seen)}"
    for name, (_, arg, registers, registry) in seen.items():
        ((param, p),) = inspect.signature(_specs()[name]).parameters.items()
        assert _code(arg) == f"{param}: {p.annotation}", name
        if name in REGISTRATION_HOOKS:
            assert _code(registers.split(" → ")[0]) == _callback_spec(p.annotation), name
            assert registry.startswith("—") or _code(registry) == REGISTRATION_HOOKS[name], name


def _render_default(field: attrs.Attribute) -> str:
    d = field.default
    if d is attrs.NOTHING:
        return "required"
    if isinstance(d, attrs.Factory):
        d = d.factory()
    if isinstance(d, type):
        return f"`{d.__name__}`"
    if attrs.has(type(d)) and d == type(d)():
        return f"`{type(d).__name__}()`"
    return "`" + repr(d).replace("'", '"') + "`"


@pytest.mark.parametrize("cls", sorted(set(_registry_types().values())) + list(NESTED_SPECS))
def test_plugin_guide_spec_table_lists_every_field(cls):
    section = GUIDE_MD[GUIDE_MD.index("## 11. Spec reference") :]
    assert f"#### `{cls}`" in section, f"docs/plugin-guide.md section 11: no table for {cls}"
    rows = _table(section, ["field", "type", "default", "meaning"], after=f"#### `{cls}`")
    documented = [(_code(r[0]), _code(r[1]), r[2]) for r in rows]
    fields = [(f.name, f.type.replace("'", '"'), _render_default(f)) for f in attrs.fields(getattr(interfaces, cls))]
    assert documented == fields, f"docs/plugin-guide.md, {cls}: the table differs from the class"
    assert all(r[3] for r in rows), f"docs/plugin-guide.md, {cls}: a field without its meaning"
