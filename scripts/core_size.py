"""The core's size and shape: logical lines of ``dare_core`` and the structural limits.

    python scripts/core_size.py            # the tables
    python scripts/core_size.py --check    # exit 1 when a budget or a limit is exceeded

*Logical lines* are Python's logical lines (statements; a call wrapped over five physical lines
is one) that are code: docstrings, comments and blank lines are not counted, so formatting never
trades layout for budget. The testing kit (``dare_core/testing``) is counted apart, with its own
budget. The structural limits hold for every function of the core and the libraries
(``libs/*/src``): at most :data:`MAX_FUNCTION_LINES` physical lines and :data:`MAX_PARAMETERS`
parameters (``self``/``cls`` not counted); :data:`EXCEPTIONS` lists the functions allowed past
them, each with its reason.
"""

from __future__ import annotations

import ast
import io
import pathlib
import sys
import tokenize

REPO = pathlib.Path(__file__).resolve().parents[1]
ROOT = REPO / "dare_core"
#: logical lines of the core without its testing kit, and of the testing kit
BUDGET = 4000
KIT_BUDGET = 1000
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 7
#: ``path:function`` -> why it may exceed a limit
EXCEPTIONS = {
    "dare_core/config/loader.py:resolve": "the layered resolution (family preset, recipe, file, overrides) "
    "collects every section's errors before reporting them at once",
    "dare_core/interfaces/seams.py:accumulate": "the AccumulatingLoss seam: the row estimate and the "
    "loss's row-aligned inputs, as PolicyLoss takes them",
    "libs/dare-objectives/src/dare_objectives/elbo.py:accumulate": "implements the AccumulatingLoss seam",
    "libs/dare-objectives/src/dare_objectives/replay_loss.py:accumulate": "implements the AccumulatingLoss seam",
    "libs/dare-objectives/src/dare_objectives/replay_loss.py:_chunk": "one chunk of the replay loss: "
    "the seam's row-aligned inputs of those rows",
    "dare_core/models/base.py:__init__": "HFDiffusionWrapper's keyword-only declarations (token ids, "
    "capabilities, block size) each family passes",
    "libs/dare-nn/src/dare_nn/layers.py:attend": "the attention kernel's arguments (queries, keys, values, "
    "mask, cache, scaling, kernel choice)",
    "libs/dare-nn/src/dare_nn/layers.py:decoder_inputs": "the decoder's input arguments as the HF "
    "forward signature names them",
}


def logical_lines(path: pathlib.Path) -> int:
    """Logical lines of code in ``path``: statements, without docstrings and comments."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    docstrings.add(body[0].end_lineno)
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for t in tokens if t.type == tokenize.NEWLINE and t.start[0] not in docstrings)


def sizes() -> dict[str, int]:
    """Logical lines per top-level package or module of ``dare_core``."""
    out: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        key = rel.parts[0] if len(rel.parts) > 1 else rel.name
        out[key] = out.get(key, 0) + logical_lines(path)
    return out


def oversized() -> list[str]:
    """Functions of the core and the libraries past a structural limit and not in :data:`EXCEPTIONS`."""
    paths = [*ROOT.rglob("*.py"), *REPO.glob("libs/*/src/**/*.py")]
    out = []
    for path in sorted(paths):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            params = _parameters(node)
            if (lines > MAX_FUNCTION_LINES or params > MAX_PARAMETERS) and f"{rel}:{node.name}" not in EXCEPTIONS:
                out.append(f"{rel}:{node.lineno} {node.name}: {lines} lines, {params} parameters")
    return out


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def main(argv: list[str]) -> int:
    table = sizes()
    width = max(len(k) for k in table)
    for key, n in sorted(table.items(), key=lambda kv: -kv[1]):
        print(f"{key:<{width}}  {n:>5}")
    kit = table.pop("testing", 0)
    total = sum(table.values())
    print(f"{'core':<{width}}  {total:>5}  logical lines (budget {BUDGET}, testing kit apart)")
    print(f"{'kit':<{width}}  {kit:>5}  logical lines (budget {KIT_BUDGET})")
    over = oversized()
    print(
        f"functions past {MAX_FUNCTION_LINES} lines or {MAX_PARAMETERS} parameters: {len(over)} "
        f"({len(EXCEPTIONS)} listed exceptions)"
    )
    for line in over:
        print(f"  {line}")
    failed = total > BUDGET or kit > KIT_BUDGET or bool(over)
    return 1 if "--check" in argv and failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
