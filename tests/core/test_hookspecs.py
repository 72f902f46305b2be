"""Every hook spec is documented and tested; the lifecycle hooks behave as documented."""

from __future__ import annotations

import inspect
import pathlib
import re
import types

import pytest

import dare_core.hookspecs as hookspecs
import dare_core.train as train_mod
from dare_core import hookimpl
from dare_core.config import resolve
from dare_core.plugins import build

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _specs() -> dict[str, object]:
    return {name: fn for name, fn in vars(hookspecs).items()
            if inspect.isfunction(fn) and hasattr(fn, "dare_spec")}


def _test_files() -> list[pathlib.Path]:
    files = set()
    for base in ("tests", "plugins", "contrib"):
        for pattern in ("test_*.py", "*_test.py", "conftest.py"):
            files.update((ROOT / base).rglob(pattern))
    return sorted(files)


def test_there_are_hook_specs():
    names = set(_specs())
    assert {"dare_register_model_wrappers", "dare_register_algorithms", "dare_register_commands",
            "dare_addhooks", "dare_configure", "dare_on_step_end", "dare_unconfigure"} <= names
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
    corpus = "\n".join(p.read_text(errors="replace") for p in _test_files()
                       if p.resolve() != pathlib.Path(__file__).resolve())
    missing = [name for name in _specs() if name not in corpus]
    # the lifecycle hooks are exercised in this file, below
    lifecycle = {"dare_addhooks", "dare_configure", "dare_on_step_end", "dare_unconfigure"}
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
    def dare_on_step_end(step, metrics):
        events.append((name, "step", step, dict(metrics)))

    @hookimpl
    def dare_unconfigure(config):
        events.append((name, "unconfigure", config))

    mod.dare_configure, mod.dare_on_step_end, mod.dare_unconfigure = (
        dare_configure, dare_on_step_end, dare_unconfigure)
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
def test_train_calls_configure_and_unconfigure_around_the_workflow(make_dare, ckpt, tmp_path,
                                                                    monkeypatch, load_calls, fail):
    events: list = []
    d = make_dare(_observer("obs", events))
    config = resolve(d, algo="algo_a", model="toy",
                     overrides=[f"model.path={ckpt}", f"output_dir={tmp_path / 'runs'}", "run_name=r"])

    class FakeCtx:
        def log(self, msg):
            events.append(("ctx", "log", msg))

    def fake_setup(dare, cfg, *, rundir):
        assert [e[1] for e in events] == ["configure"]  # configured before set-up
        return FakeCtx()

    def fake_workflow(ctx):
        d.pm.hook.dare_on_step_end(step=1, metrics={"loss": 1.0})
        if fail:
            raise RuntimeError("workflow failed")
        return {"eval": {"after": {"accuracy": 1.0}}, "final_checkpoint": None}

    monkeypatch.setattr(train_mod, "setup", fake_setup)
    monkeypatch.setitem(train_mod.WORKFLOWS, "rl", fake_workflow)
    if fail:
        with pytest.raises(RuntimeError, match="workflow failed"):
            train_mod.train(d, config)
    else:
        summary = train_mod.train(d, config)
        assert summary["algo"] == "algo_a" and summary["eval"]["after"]["accuracy"] == 1.0
        assert (tmp_path / "runs" / "r" / "summary.json").is_file()
    kinds = [e[1] for e in events if e[0] == "obs"]
    assert kinds == ["configure", "step", "unconfigure"]
    assert events[0][2] is config
    assert load_calls == []
