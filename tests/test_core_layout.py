"""The core stays small and layered: its logical lines are within budget and no function of the core
or the libraries is past the structural limits (``scripts/core_size.py``), and no
two of its packages import each other, directly or through others (lazy imports included)."""

import ast
import importlib.util
import pathlib
import re

import dare_core

ROOT = pathlib.Path(dare_core.__file__).parent
SCRIPT = ROOT.parent / "scripts" / "core_size.py"


def _unit(module: str) -> str:
    """``dare_core.config.loader`` → ``config``; ``dare_core`` itself → ``dare_core``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dare_core"


def import_graph() -> dict[str, set[str]]:
    """Package (or top-level module) of the core → the core packages it imports."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        src = rel.parts[0] if len(rel.parts) > 1 else ("dare_core" if rel.stem == "__init__" else rel.stem)
        edges = graph.setdefault(src, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dare_core":
                if node.module == "dare_core":  # "from dare_core import x": a submodule or the package
                    targets = [
                        a.name if (ROOT / a.name).exists() or (ROOT / f"{a.name}.py").exists() else "dare_core"
                        for a in node.names
                    ]
                else:
                    targets = [_unit(node.module)]
            elif isinstance(node, ast.Import):
                targets = [_unit(a.name) for a in node.names if a.name.split(".")[0] == "dare_core"]
            else:
                continue
            edges.update(t for t in targets if t != src)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path ``[a, b, ..., a]``, or ``[]``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if not state.get(nxt):
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if not state.get(node):
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycles_between_core_packages():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def _core_size():
    spec = importlib.util.spec_from_file_location("core_size", SCRIPT)
    core_size = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core_size)
    return core_size


def test_core_size_and_shape_are_within_budget(capsys):
    assert _core_size().main(["--check"]) == 0, capsys.readouterr().out


def test_logical_lines_ignore_docstrings_comments_and_wrapping(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        '"""Doc."""\n\n# note\ndef f(a,\n      b):\n    """Doc\n    more."""\n    return (a +\n            b)\n'
    )
    assert _core_size().logical_lines(path) == 2


def test_every_listed_exception_names_a_function_past_a_limit():
    core_size = _core_size()
    listed = set(core_size.EXCEPTIONS)
    core_size.EXCEPTIONS = {}
    found = {
        line.split(" ")[0].rsplit(":", 1)[0] + ":" + line.split(" ")[1].rstrip(":") for line in core_size.oversized()
    }
    assert listed <= found, sorted(listed - found)


def test_distributions_use_the_public_api():
    """Plugins, libraries, ``research/`` and ``scripts/`` import the core through ``dare_core``
    (``hookimpl``), ``dare_core.api`` and the testing kit only; everything else in ``dare_core`` is
    private."""
    repo = ROOT.parent
    allowed = re.compile(r"^\s*(from|import)\s+dare_core(\.api|\.testing[\w.]*)?\b(?!\.)")
    offenders = []
    for path in sorted(
        [
            *repo.glob("plugins/*/*/src/**/*.py"),
            *repo.glob("libs/*/src/**/*.py"),
            *repo.glob("contrib/*/src/**/*.py"),
            *repo.glob("research/*.py"),
            *repo.glob("scripts/**/*.py"),
        ]
    ):
        if "testing" in path.parts:
            continue  # testing helpers may drive the CLI and the plugin manager directly
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"^\s*(from|import)\s+dare_core", line) and not allowed.match(line):
                offenders.append(f"{path.relative_to(repo)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
