"""Every hook spec is documented and tested; the lifecycle hooks behave as documented."""

from __future__ import annotations

import inspect
import pathlib
import re
import types

import pytest

import dare_core.hookspecs as hookspecs
import dare_core.train as train_mod
import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core import hookimpl
from dare_core.config import resolve
from dare_core.interfaces import WorkflowSpec
from dare_core.plugins import build

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _specs() -> dict[str, object]:
    return {name: fn for name, fn in vars(hookspecs).items() if inspect.isfunction(fn) and hasattr(fn, "dare_spec")}


def _test_files() -> list[pathlib.Path]:
    files = set()
    for base in ("tests", "plugins", "contrib"):
        for pattern in ("test_*.py", "*_test.py", "conftest.py"):
            files.update((ROOT / base).rglob(pattern))
    return sorted(files)


def test_there_are_hook_specs():
    names = set(_specs())
    assert {
        "dare_register_model_wrappers",
        "dare_register_algorithms",
        "dare_register_commands",
        "dare_register_config_sections",
        "dare_addhooks",
        "dare_configure",
        "dare_on_run_start",
        "dare_on_step_end",
        "dare_on_eval",
        "dare_unconfigure",
    } <= names
    assert all(name.startswith("dare_") for name in names)


@pytest.mark.parametrize("name", sorted(_specs()))
def test_spec_docstring_has_params_and_when_called(name):
    fn = _specs()[name]
    doc = inspect.getdoc(fn) or ""
    assert doc.strip(), f"{name} has no docstring"
    for param in inspect.signature(fn).parameters:
        assert re.search(rf":param {param}:", doc), f"{name}: no ':param {param}:' line"
    assert re.search(r"\bcalled\b", doc, re.IGNORECASE), f"{name}: no sentence saying when it is called"


def test_every_spec_is_in_the_hook_reference():
    text = (ROOT / "docs" / "hooks.md").read_text()
    missing = [name for name in _specs() if f"### `{name}(" not in text]
    assert not missing, f"not documented in docs/hooks.md: {missing}"


def test_every_spec_is_exercised_by_a_test():
    corpus = "\n".join(
        p.read_text(errors="replace") for p in _test_files() if p.resolve() != pathlib.Path(__file__).resolve()
    )
    missing = [name for name in _specs() if name not in corpus]
    # the lifecycle hooks are exercised in this file, below
    lifecycle = {
        "dare_addhooks",
        "dare_configure",
        "dare_on_run_start",
        "dare_on_step_end",
        "dare_on_eval",
        "dare_unconfigure",
    }
    here = pathlib.Path(__file__).read_text()
    missing = [name for name in missing if not (name in lifecycle and f"def {name}(" in here)]
    assert not missing, f"no test uses: {missing}"


# ----------------------------------------------------------------------------- lifecycle hooks
def _observer(name: str, events: list) -> types.ModuleType:
    mod = types.ModuleType(name)

    @hookimpl
    def dare_configure(config):
        events.append((name, "configure", config))

    @hookimpl
    def dare_on_run_start(config, run_dir):
        events.append((name, "run_start", config, run_dir))

    @hookimpl
    def dare_on_step_end(step, metrics):
        events.append((name, "step", step, dict(metrics)))

    @hookimpl
    def dare_on_eval(step, label, metrics):
        events.append((name, "eval", step, label, dict(metrics)))

    @hookimpl
    def dare_unconfigure(config):
        events.append((name, "unconfigure", config))

    mod.dare_configure, mod.dare_on_step_end, mod.dare_unconfigure = (
        dare_configure,
        dare_on_step_end,
        dare_unconfigure,
    )
    mod.dare_on_run_start, mod.dare_on_eval = dare_on_run_start, dare_on_eval
    return mod


def test_dare_addhooks_adds_specs_for_plugins_registered_before_and_after():
    spec_mod = types.ModuleType("more_specs")
    marker = __import__("pluggy").HookspecMarker("dare")

    @marker
    def my_extra_hook(value):
        """An extra hook."""

    spec_mod.my_extra_hook = my_extra_hook
    host = types.ModuleType("host")

    @hookimpl
    def dare_addhooks(pluginmanager):
        pluginmanager.add_hookspecs(spec_mod)

    host.dare_addhooks = dare_addhooks
    d = build(load_entrypoints=False, default_plugins=False, extra_plugins=[host])
    late = types.ModuleType("late")
    late.my_extra_hook = hookimpl(lambda value: value * 2)
    d.pm.register(late, name="late")
    assert d.pm.hook.my_extra_hook(value=21) == [42]
    assert "dare_addhooks" in {i.name: i for i in d.plugin_infos()}["host"].hooks


def test_dare_configure_is_historic_and_observers_all_see_steps():
    events: list = []
    d = build(load_entrypoints=False, default_plugins=False, extra_plugins=[_observer("early", events)])
    config = object()
    d.pm.hook.dare_configure.call_historic(kwargs={"config": config})
    d.pm.register(_observer("late", events), name="late")  # registered after the run started
    assert [(e[0], e[1]) for e in events] == [("early", "configure"), ("late", "configure")]
    events.clear()
    assert d.pm.hook.dare_on_step_end(step=1, metrics={"loss": 0.5}) == []
    assert sorted(e[0] for e in events) == ["early", "late"]
    assert all(e[2:] == (1, {"loss": 0.5}) for e in events)
    events.clear()
    d.pm.hook.dare_unconfigure(config=config)
    assert sorted(e[:2] for e in events) == [("early", "unconfigure"), ("late", "unconfigure")]


@pytest.mark.parametrize("fail", [False, True])
def test_train_calls_configure_and_unconfigure_around_the_workflow(
    make_dare, ckpt, tmp_path, monkeypatch, load_calls, fail
):
    events: list = []
    d = make_dare(_observer("obs", events))
    config = resolve(
        d, algo="algo_a", model="toy", overrides=[f"model.path={ckpt}", f"output_dir={tmp_path / 'runs'}", "run_name=r"]
    )

    class FakeCtx:
        engine = types.SimpleNamespace(is_main=True)

        def log(self, msg):
            events.append(("ctx", "log", msg))

    def fake_setup(dare, cfg, *, rundir, **_engine_and_resume):
        assert [e[1] for e in events] == ["configure"]  # configured before set-up
        rundir.write_config({"algo": cfg.algo})
        return FakeCtx()

    def fake_workflow(ctx):
        d.pm.hook.dare_on_step_end(step=1, metrics={"loss": 1.0})
        if fail:
            raise RuntimeError("workflow failed")
        return {"eval": {"after": {"accuracy": 1.0}}, "final_checkpoint": None}

    monkeypatch.setattr(train_mod, "setup", fake_setup)
    monkeypatch.setitem(
        d.registries.workflows._items, "rl", WorkflowSpec("rl", fake_workflow, "a stand-in for the rl loop")
    )
    if fail:
        with pytest.raises(RuntimeError, match="workflow failed"):
            train_mod.train(d, config)
    else:
        summary = train_mod.train(d, config)
        assert summary["algo"] == "algo_a" and summary["eval"]["after"]["accuracy"] == 1.0
        assert (tmp_path / "runs" / "r" / "summary.json").is_file()
    kinds = [e[1] for e in events if e[0] == "obs"]
    assert kinds == ["configure", "run_start", "step", "unconfigure"]
    assert events[0][2] is config
    start = next(e for e in events if e[1] == "run_start")
    assert start[2] is config and start[3] == str(tmp_path / "runs" / "r")
    assert load_calls == []


def test_run_start_and_eval_hooks_in_a_real_run(tmp_path):
    """A tiny real run: ``dare_on_run_start`` finds the written config, ``dare_on_eval`` sees every
    held-out evaluation with the values of ``metrics.jsonl``, each after its step's step-end."""
    import json
    import os

    from dare_core.testing import toy
    from dare_core.testing.digits import DigitsPlugin

    events: list = []
    found: list = []
    obs = _observer("obs", events)
    plain_start = obs.dare_on_run_start

    @hookimpl
    def dare_on_run_start(config, run_dir):
        found.append(sorted(os.listdir(run_dir)))
        plain_start(config=config, run_dir=run_dir)

    obs.dare_on_run_start = dare_on_run_start
    d = build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, DigitsPlugin(), obs])
    cfg = resolve(
        d,
        algo="pg_test",
        model="toy",
        overrides=[
            "task.name=digits",
            "task.num_eval=8",
            "rollout.gen_length=4",
            "rollout.block_length=4",
            "rollout.steps=4",
            "eval.batch_size=8",
            "progress=false",
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=r",
            "trainer.steps=4",
            "trainer.batch_size=2",
            "trainer.group_size=2",
            "eval.every=2",
            "trainer.save_final=false",
        ],
    )
    train_mod.train(d, cfg)
    assert "config.yaml" in found[0]
    kinds = [(e[1], e[2] if e[1] in ("step", "eval") else None) for e in events]
    assert kinds == [
        ("configure", None),
        ("run_start", None),
        ("eval", 0),
        ("step", 1),
        ("step", 2),
        ("eval", 2),
        ("step", 3),
        ("step", 4),
        ("eval", 4),
        ("unconfigure", None),
    ]
    evals = [e for e in events if e[1] == "eval"]
    assert [e[3] for e in evals] == ["before", "step-2", "after"]
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [e[4] for e in evals] == [x["eval"] for x in lines if "eval" in x]
    assert "vs_before" in evals[-1][4] and "vs_before" not in evals[0][4]
