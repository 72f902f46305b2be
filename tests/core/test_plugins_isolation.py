"""A broken plugin takes only itself down: the ``dare`` command with temporary entry-point plugins
(a ``*.dist-info`` with ``entry_points.txt`` on ``PYTHONPATH``) — one that works, one that fails to
import, one whose registration hook raises after registering, one whose command hook raises.

Every command warns once per broken plugin, in one line; ``dare plugins`` lists them with their
reason; the other plugins work; a command that needs a broken plugin fails in one line (exit 2,
no traceback). ``DARE_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PLUGINS = {
    "good_plugin": """
        import attrs
        from dare_core.api import AlgorithmSpec, TaskSpec, hookimpl, lazy

        @attrs.frozen
        class GoodConfig:
            pass

        @hookimpl
        def dare_register_tasks(register):
            register(TaskSpec("good_task", lazy("good_plugin:nothing"), "a task of the good plugin"))

        @hookimpl
        def dare_register_algorithms(register):
            register(AlgorithmSpec("good_algo", "rl", GoodConfig, lazy("good_plugin:nothing")))
    """,
    "import_broken_plugin": """
        import dare_test_missing_dependency_xyz  # noqa: F401
    """,
    "hook_broken_plugin": """
        from dare_core.api import ComponentSpec, TaskSpec, hookimpl, lazy

        @hookimpl
        def dare_register_tasks(register):
            register(TaskSpec("half_task", lazy("hook_broken_plugin:nothing")))

        @hookimpl
        def dare_register_algorithms(register):
            raise RuntimeError("the spec could not be built:\\n  see the plugin's docs")

        @hookimpl
        def dare_register_commands(cli):
            raise AssertionError("never called: the plugin is unregistered")
    """,
    "command_broken_plugin": """
        from dare_core.api import hookimpl

        @hookimpl
        def dare_register_commands(cli):
            raise ValueError("no click here")
    """,
}
IDS = {
    "good": "good_plugin",
    "import_broken": "import_broken_plugin",
    "hook_broken": "hook_broken_plugin",
    "command_broken": "command_broken_plugin",
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A directory holding the four plugin modules and their distribution's metadata."""
    root = tmp_path_factory.mktemp("isolation")
    for module, source in PLUGINS.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / "dare_test_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dare-test-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dare]\n" + "".join(f"{k} = {v}\n" for k, v in IDS.items()))
    return root


def dare(plugin_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``dare ARGS`` with only the temporary plugins (and the core's defaults) loaded."""
    environ = {k: v for k, v in os.environ.items() if k not in ("DARE_DISABLE_PLUGINS", "DARE_DEBUG")}
    environ["PYTHONPATH"] = os.pathsep.join([str(plugin_path), *filter(None, [environ.get("PYTHONPATH")])])
    environ["DARE_PLUGINS"] = ",".join(IDS)
    return subprocess.run(
        [sys.executable, "-m", "dare_core", *args], capture_output=True, text=True, env={**environ, **env}, timeout=300
    )


def warnings(proc: subprocess.CompletedProcess) -> dict[str, str]:
    return {line.split("'")[1]: line for line in proc.stderr.splitlines() if line.startswith("warning: plugin")}


def test_every_command_warns_once_per_broken_plugin_in_one_line(plugin_path):
    proc = dare(plugin_path, "--help")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    found = warnings(proc)
    assert sorted(found) == ["command_broken", "hook_broken", "import_broken"]
    assert proc.stderr.count("warning:") == 3
    assert found["import_broken"] == (
        "warning: plugin 'import_broken' (dare-test-plugins) is broken: ModuleNotFoundError: No module "
        "named 'dare_test_missing_dependency_xyz'; reinstall it or disable it with "
        "DARE_DISABLE_PLUGINS=import_broken"
    )
    assert (
        "is broken: dare_register_algorithms raised RuntimeError: the spec could not be built: see the plugin's docs;"
    ) in found["hook_broken"]
    assert "is broken: dare_register_commands raised ValueError: no click here;" in found["command_broken"]
    # the advice works
    quiet = dare(plugin_path, "--help", DARE_PLUGINS="good,hook_broken", DARE_DISABLE_PLUGINS="hook_broken")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_dare_plugins_lists_the_broken_ones_with_their_reason(plugin_path):
    proc = dare(plugin_path, "plugins")
    assert proc.returncode == 0
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:]}
    assert "register_algorithms, register_tasks" in rows["good"]
    assert "BROKEN: ModuleNotFoundError: No module named 'dare_test_missing_dependency_xyz'" in rows["import_broken"]
    assert "BROKEN: dare_register_algorithms raised RuntimeError" in rows["hook_broken"]
    assert "dare_core.default_plugins.components" in rows
    as_json = {p["name"]: p for p in json.loads(dare(plugin_path, "plugins", "--json").stdout)}
    assert as_json["good"]["broken"] == "" and as_json["hook_broken"]["hooks"] == []
    assert as_json["command_broken"]["broken"] == "dare_register_commands raised ValueError: no click here"
    assert as_json["import_broken"]["distribution"] == "dare-test-plugins"


def test_the_other_plugins_keep_working(plugin_path):
    tasks = dare(plugin_path, "list", "tasks")
    assert tasks.returncode == 0
    assert "good_task" in tasks.stdout and "half_task" not in tasks.stdout  # the partial registration is dropped
    losses = dare(plugin_path, "list", "losses")
    assert "clipped_pg" in losses.stdout
    algorithms = dare(plugin_path, "list", "algorithms", "--json")
    assert [row["algorithm"] for row in json.loads(algorithms.stdout)] == ["good_algo"]


def test_a_command_that_needs_a_broken_plugin_fails_in_one_line(plugin_path):
    proc = dare(plugin_path, "config", "show", "--algo", "half_algo", "--model", "any")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("warning:")]
    assert len(errors) == 1 and errors[0].startswith("error: unknown ")
    assert (
        "broken plugins, not loaded: 'hook_broken' (dare-test-plugins), 'import_broken' (dare-test-plugins)"
    ) in errors[0]  # the command hooks run for plugin commands only


def test_an_unknown_id_in_dare_plugins_is_one_line_naming_it(plugin_path):
    proc = dare(plugin_path, "list", DARE_PLUGINS="god")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: DARE_PLUGINS names 'god', which is not an installed plugin; installed: "
        + ", ".join(sorted({*IDS, *_installed_ids()}))
        + "; did you mean 'good'?"
    )


def _installed_ids() -> set[str]:
    import importlib.metadata as md

    return {ep.name for ep in md.entry_points(group="dare")}


def test_dare_debug_shows_the_traceback(plugin_path):
    proc = dare(plugin_path, "list", DARE_DEBUG="1")
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "dare_test_missing_dependency_xyz" in proc.stderr
