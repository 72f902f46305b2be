"""The ``dare`` commands that only read specs — ``--help``, ``plugins``, ``list``, ``list --matrix``
and a run whose config is wrong — import neither torch nor transformers, with every installed
plugin loaded: plugin entry modules register configs, constants and ``lazy(...)`` callables, and
the CLI imports the training code only once the config is resolved.

Each command runs as ``python -X importtime -m dare_core ...`` in a fresh process; the test reads
the modules it imported from the import-time report.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dare_core.listing import supports
from dare_core.plugins import build

HEAVY = ("torch", "transformers", "safetensors")


def run_dare(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``dare ARGS``; the result and the top-level packages it imported."""
    environ = {k: v for k, v in os.environ.items() if k not in ("DARE_PLUGINS", "DARE_DISABLE_PLUGINS")}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dare_core", *args],
        capture_output=True,
        text=True,
        env={**environ, **(env or {})},
        timeout=300,
    )
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, imported


def test_the_import_report_is_read():
    """The check below can fail: a command that trains does import torch."""
    proc, imported = run_dare("--version")
    assert proc.returncode == 0 and "dare_core" in imported and "click" in imported
    probe = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import torch"], capture_output=True, text=True, timeout=300
    )
    assert any(line.rstrip().endswith("| torch") for line in probe.stderr.splitlines())


@pytest.mark.parametrize(
    "args", [("--help",), ("plugins",), ("plugins", "--json"), ("list",), ("list", "--matrix"), ("list", "algorithms")]
)
def test_listing_commands_import_no_torch(args):
    proc, imported = run_dare(*args)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" not in proc.stderr, proc.stderr  # every installed plugin loaded
    assert not imported & set(HEAVY), f"dare {' '.join(args)} imported {sorted(imported & set(HEAVY))}"


def _supported_pair() -> tuple[str, str]:
    """An installed algorithm and a model family it supports (skips when there is none)."""
    regs = build().registries
    for algo_name, algo in regs.algorithms.items():
        for family_name, family in regs.models.items():
            if supports(algo, family) and algo.workflow == "rl":
                return algo_name, family_name
    pytest.skip("no installed RL algorithm with a model family it supports")


@pytest.mark.parametrize(
    "override,problem",
    [
        ("trainer.lr=abc", "trainer.lr: expected float, got 'abc'"),
        ("trainer.no_such_key=1", "trainer.no_such_key: unknown key"),
    ],
)
def test_a_config_error_is_reported_before_torch_is_imported(override, problem):
    algo, model = _supported_pair()
    proc, imported = run_dare("train", "--algo", algo, "--model", model, override)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: invalid configuration") and problem in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not imported & set(HEAVY), f"imported {sorted(imported & set(HEAVY))}"


def test_the_core_modules_a_plugin_registers_with_import_no_torch():
    code = """
import sys
import dare_core.cli, dare_core.config, dare_core.hookspecs, dare_core.interfaces, dare_core.listing
import dare_core.plugins, dare_core.registry
import dare_core.api as api
from dare_core.api import AlgorithmSpec, ComponentSpec, DareError, ModelFamily, hookimpl, lazy, option, positive
assert "HFDiffusionWrapper" in dir(api) and "ClippedPolicyLoss" in api.__all__
print(sorted(m for m in %r if m in sys.modules))
""" % (HEAVY + ("numpy", "pandas"),)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_lazy_api_name_resolves_to_the_module_attribute():
    import dare_core.api as api
    from dare_core.components.losses import ClippedPolicyLoss

    assert api.ClippedPolicyLoss is ClippedPolicyLoss and "ClippedPolicyLoss" in vars(api)  # kept
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        api.NoSuchName  # noqa: B018
