"""The core stays small and layered: its logical lines are within budget and no function of the core
or the libraries is past the structural limits (``scripts/core_size.py``), and no
two of its packages import each other, directly or through others (lazy imports included). The
distributions built on it reach it through ``dare_core.api`` only, whose names are the listed
:data:`PUBLIC_API`, and libraries and plugins import no plugin."""

import ast
import importlib.util
import pathlib
import re

import dare_core

ROOT = pathlib.Path(dare_core.__file__).parent
REPO = ROOT.parent
SCRIPT = REPO / "scripts" / "core_size.py"

#: ``dare_core.api.__all__``: what plugins, libraries, ``contrib/``, ``research/``, ``scripts/`` and
#: the plugin templates import, and the names the docs give plugin authors. A name joins or leaves
#: the public API in ``dare_core/api.py`` and here together.
PUBLIC_API = frozenset(
    " ".join(
        [
            # the seams (dare_core.interfaces)
            "AccumulatingLoss AdvantageEstimator AlgorithmSpec Components ComponentSpec ConfigSection Corrupted",
            "Engine EngineSpec Example ForwardCorruption LikelihoodEstimator ModelFamily ModelWrapper PolicyLoss",
            "PreferenceComponents PreferenceLoss RLComponents RolloutBackend RolloutBatch RolloutNeeds RolloutSpec",
            "RowEstimate SFTComponents SFTObjective Score",
            "SequenceBatch SyncedRolloutBackend Task TaskSpec Totals TrainingRows TrajectoryBuilder",
            "TrajectoryContext UpdateBatch UpdateObjective WorkflowSpec",
            # registration, config and errors
            "build get_dare hookimpl lazy RunConfig TaskConfig option resolve structure to_dict misfit",
            "parse_overrides divides in_range non_negative one_of optional positive probability preflight",
            "CapabilityError ConfigError DareError DivergenceError PromptFitError run_script context_length info quiet",
            # generic components
            "ComponentLookup corrupted_logprobs GroupNormAdvantage RandomRatioMasking mask_tokens",
            "MaskedTokenLogProb ClippedPolicyLoss agg_loss kl_penalty mask_totals masked_mean sum_totals",
            "FinalSequence",
            # models and training paths
            "HFDiffusionWrapper gather_logprobs no_hf_progress_bar HALF DocumentMask available_kernels cu_seqlens document_mask",
            "DEFAULT_CHUNK_ELEMENTS chunk_rows fused_token_logprobs naive_token_logprobs plan_packing",
            "configure_training_paths param_dtype select_training_paths for_device",
            # what workflows and commands in plugins drive
            "Context build_rollout eval_backend_name eval_context setup evaluate PolicyObjective",
            "ReferencePolicy collect estimate_no_grad rows_update_batch training_rollout build_components",
            "default_collate UpdatePlan UpdateStats backward_minibatch update Tracker STREAM_CORRUPTION",
            "STREAM_DATA BatchStream chunks decode_responses encode_prompts left_pad compare describe",
            "paired_counts RunDir atomic_write_file atomic_write_text",
            # engines
            "SingleProcessEngine ProcessGroup ProcessGroupEngine adamw cast_for_precision lr_at set_lr",
            "trainable_parameters collective_generation lockstep",
        ]
    ).split()
)


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


_API_IMPORT = re.compile(r"^[ \t]*from[ \t]+dare_core\.api[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)


def api_imports(text: str) -> set[str]:
    """The names ``text`` (Python, a template or Markdown) imports with ``from dare_core.api import``."""
    names = set()
    for match in _API_IMPORT.finditer(text):
        for line in match.group(1).strip("()").splitlines():
            for item in line.split("#")[0].split(","):
                if item.strip():
                    names.add(item.split()[0])  # "X as Y" imports X
    return names


def api_users() -> dict[str, set[str]]:
    """Each name imported from ``dare_core.api`` -> the files importing it: the sources and tests of
    plugins, libraries and ``contrib/``, ``research/``, ``scripts/``, the plugin templates and the
    examples of the docs."""
    files = [
        *REPO.glob("plugins/*/*/**/*.py"),
        *REPO.glob("libs/*/**/*.py"),
        *REPO.glob("contrib/*/**/*.py"),
        *REPO.glob("research/*.py"),
        *REPO.glob("scripts/**/*.py"),
        *ROOT.glob("templates/**/*.tmpl"),
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
    ]
    users: dict[str, set[str]] = {}
    for path in files:
        for name in api_imports(path.read_text()):
            users.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return users


def test_the_import_scan_reads_every_form():
    text = "from dare_core.api import A, B as C  # note\n    from dare_core.api import (\n    D,\n    E,  # e\n)\n"
    assert api_imports(text) == {"A", "B", "D", "E"}
    assert api_imports("from dare_core.apix import F\nimport dare_core.api\n") == set()


def test_the_public_api_is_the_listed_set():
    import dare_core.api as api

    extra, missing = sorted(set(api.__all__) - PUBLIC_API), sorted(PUBLIC_API - set(api.__all__))
    assert not extra and not missing, (
        f"dare_core.api exports {extra} beyond PUBLIC_API and lacks {missing}; "
        f"change dare_core/api.py and PUBLIC_API (tests/test_core_layout.py) together"
    )
    unresolved = [name for name in api.__all__ if not hasattr(api, name)]
    assert not unresolved, f"dare_core.api lists names its modules do not define: {unresolved}"


def test_distributions_import_only_public_names():
    private = {name: sorted(files) for name, files in api_users().items() if name not in PUBLIC_API}
    assert not private, f"imported from dare_core.api but not public (PUBLIC_API): {private}"


def test_every_public_name_is_used_or_documented():
    """A public name is imported by a plugin, library, ``contrib/``, ``research/``, ``scripts/``, a
    plugin template or a docs example, or named (in backticks) in the docs plugin authors read."""
    docs = "\n".join(p.read_text() for p in sorted(REPO.glob("docs/*.md")))
    used = set(api_users())
    unused = sorted(n for n in PUBLIC_API - used if not re.search(rf"`[^`\n]*\b{n}\b[^`\n]*`", docs))
    assert not unused, (
        f"public names nobody outside the core imports and no doc names: {unused}; remove them from "
        f"dare_core/api.py and PUBLIC_API, or document them (docs/plugin-guide.md)"
    )


def test_libraries_and_plugins_import_no_other_plugin():
    """Plugins meet through the registries: a library's code imports no plugin, and a plugin's code
    imports no other plugin (what two of them share lives in a library, ``libs/``)."""
    offenders = []
    for src in sorted([*REPO.glob("libs/*/src"), *REPO.glob("plugins/*/*/src"), *REPO.glob("contrib/*/src")]):
        own = {p.name for p in src.iterdir() if p.is_dir() and p.name.startswith("dare_plugin_")}
        for path in sorted(src.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules = [node.module]
                else:
                    continue
                tops = {m.split(".")[0] for m in modules}
                offenders += [
                    f"{path.relative_to(REPO)}:{node.lineno}: {top}"
                    for top in sorted(tops)
                    if top.startswith("dare_plugin_") and top not in own
                ]
    assert not offenders, "\n".join(offenders)
