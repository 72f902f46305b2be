"""Plugin manager: default plugins, extras, owners, listing, entry-point load control, broken
plugins (isolation) and ``lazy`` targets."""

from __future__ import annotations

import json
import sys
import types

import pytest

import dare_core.plugins as dare_plugins
import dare_plugin_tasks
from dare_core.errors import DareError
from dare_core.interfaces import ComponentSpec
from dare_core.plugins import DEFAULT_PLUGINS, REGISTRATION_HOOKS, build


# ----------------------------------------------------------------------------- build()
def test_build_registers_default_plugins_and_extras_with_owners(dare):
    regs = dare.registries
    assert regs.corruptions.owner("random_ratio") == "dare_core.default_plugins.components"
    assert regs.losses.owner("clipped_pg") == "dare_core.default_plugins.components"
    assert regs.advantages.owner("group_norm") == "dare_core.default_plugins.components"
    assert regs.estimators.owner("response_token_logprob") == "dare_core.default_plugins.components"
    assert regs.rollouts.owner("low_confidence") == "dare_plugin_samplers"
    assert regs.tasks.owner("sudoku") == "dare_plugin_tasks"
    assert regs.models.owner("toy") == "dare_core.testing.toy"
    assert regs.models.owner("toy_cached") == "test_families"
    assert regs.algorithms.owner("algo_a") == "test_algorithms"
    assert regs.rollouts.owner("mini") == "test_rollouts"
    assert regs.tasks.owner("echo_task") == "test_tasks"
    for attr, name in [
        ("corruptions", "test_corruption"),
        ("trajectories", "test_trajectory"),
        ("estimators", "test_estimator"),
        ("losses", "test_loss"),
        ("advantages", "test_advantage"),
    ]:
        assert regs[attr].owner(name) == "test_components"


def test_every_registration_hook_fills_its_registry():
    assert set(REGISTRATION_HOOKS.values()) == set(dare_plugins.Registries.KINDS)
    for hook in REGISTRATION_HOOKS:
        assert hasattr(dare_plugins.hookspecs, hook)


def test_engines_and_workflows_are_registered_through_hooks(make_dare, make_plugin):
    """The core registers the ``rl`` and ``sft`` workflows with its default plugin; plugins add
    engines and workflows; ``train`` refuses an algorithm whose workflow is not registered with
    the install hint, before anything is set up."""
    from dare_core.interfaces import AlgorithmSpec, EngineSpec, WorkflowSpec
    from dare_core.train import train

    def run_loop(ctx):  # pragma: no cover - never run here
        return {}

    def build_engine(config):  # pragma: no cover - never built here
        raise AssertionError

    def needs_loop(register):
        register(
            AlgorithmSpec(name="needs_loop", workflow="pair_loop", config_cls=object, build=lambda cfg, lookup: None)
        )

    extra = make_plugin(
        "engines_and_workflows",
        dare_register_engines=lambda register: register(EngineSpec("test_engine", build_engine, "test")),
        dare_register_workflows=lambda register: register(WorkflowSpec("test_loop", run_loop, "test")),
        dare_register_algorithms=needs_loop,
    )
    regs = make_dare(extra).registries
    assert regs.workflows.owner("rl") == regs.workflows.owner("sft") == "dare_core.default_plugins.components"
    assert regs.workflows.get("test_loop").run is run_loop
    assert regs.workflows.owner("test_loop") == regs.engines.owner("test_engine") == "engines_and_workflows"
    with pytest.raises(DareError, match="needs the 'pair_loop' workflow.*pip install dare-plugin-pair-loop"):
        train(make_dare(extra), types.SimpleNamespace(algo="needs_loop"))


def test_build_without_default_plugins_has_only_the_extras(make_dare):
    d = make_dare(default_plugins=False)
    assert "random_ratio" not in d.registries.corruptions
    tasks_plugin = dare_plugins.build(
        load_entrypoints=False, default_plugins=False, extra_plugins=[dare_plugin_tasks]
    ).registries.tasks.names()
    assert set(d.registries.tasks.names()) == {"echo_task", *tasks_plugin}  # exactly the extras'
    assert "sudoku" in tasks_plugin
    assert not any(i.builtin for i in d.plugin_infos())


def test_plugin_infos_list_plugins_and_hooks(dare):
    infos = {i.name: i for i in dare.plugin_infos()}
    for mod in DEFAULT_PLUGINS:
        assert infos[mod].builtin and infos[mod].distribution == "dare-core"
    assert infos["dare_plugin_samplers"].hooks == ("dare_register_rollout_backends",)
    comp = infos["test_components"]
    assert not comp.builtin and comp.distribution == "-"
    assert comp.hooks == tuple(sorted(comp.hooks))
    assert {"dare_register_corruptions", "dare_register_policy_losses", "dare_register_advantage_estimators"} <= set(
        comp.hooks
    )
    assert infos["test_commands"].hooks == ("dare_register_commands",)
    data = json.loads(json.dumps([i.as_dict() for i in dare.plugin_infos()]))
    assert {"name", "distribution", "version", "module", "hooks", "builtin"} <= set(data[0])
    assert dare.plugin_infos() is not dare.infos  # a copy


def test_a_plugin_object_without_name_gets_a_generated_one():
    class Obj:
        @dare_plugins.hookimpl
        def dare_register_tasks(self, register):
            register(types.SimpleNamespace(name="obj_task"))

    d = build(load_entrypoints=False, default_plugins=False, extra_plugins=[Obj()])
    assert d.registries.tasks.owner("obj_task") == "extra-0"


def test_get_dare_is_cached_and_reset(monkeypatch, dare):
    monkeypatch.setattr(dare_plugins, "_DARE", dare)
    assert dare_plugins.get_dare() is dare
    dare_plugins.reset()
    assert dare_plugins._DARE is None


# ----------------------------------------------------------------------------- entry points
class FakeDist:
    """An installed distribution: name, version and core metadata (``Keywords``)."""

    def __init__(self, name: str, version: str, keywords: str = ""):
        self.name, self.version = name, version
        self.metadata = {"Keywords": keywords} if keywords else {}


class FakeEntryPoint:
    """What ``importlib.metadata.entry_points(group="dare")`` yields: name, value, dist, load()."""

    group = "dare"

    def __init__(self, name: str, module: str, dist: FakeDist | None = None):
        self.name, self.value, self.dist = name, module, dist

    def load(self):
        __import__(self.value)
        return sys.modules[self.value]


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Three importable entry-point plugins ep_a, ep_b, ep_c (each registers a task named after
    it) and one, ep_bad, that fails to import; ``install(*names)`` exposes them."""

    def task_plugin(name):
        mod = types.ModuleType(f"dare_fake_{name}")

        @dare_plugins.hookimpl
        def dare_register_tasks(register):
            register(types.SimpleNamespace(name=f"task_{name}", description=""))

        mod.dare_register_tasks = dare_register_tasks
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        keywords = "dare,dare-example" if name == "ep_c" else ""  # ep_c is an example distribution
        return FakeEntryPoint(name, mod.__name__, FakeDist(f"dare-plugin-{name}", "1.2.3", keywords))

    eps = {n: task_plugin(n) for n in ("ep_a", "ep_b", "ep_c")}
    eps["ep_bad"] = FakeEntryPoint("ep_bad", "dare_fake_missing_module_xyz")
    monkeypatch.delenv("DARE_PLUGINS", raising=False)
    monkeypatch.delenv("DARE_DISABLE_PLUGINS", raising=False)

    def install(*names):
        chosen = [eps[n] for n in names]

        def entry_points(*, group=None, **kw):
            assert group == dare_plugins.ENTRY_POINT_GROUP
            return list(reversed(chosen))  # unsorted on purpose

        monkeypatch.setattr(dare_plugins.md, "entry_points", entry_points)

    return install


def _loaded(d):
    return sorted(i.name for i in d.plugin_infos() if not i.builtin)


def test_all_entry_points_load_when_unfiltered(fake_entry_points):
    fake_entry_points("ep_a", "ep_b", "ep_c")
    d = build(default_plugins=False)
    assert _loaded(d) == ["ep_a", "ep_b", "ep_c"]
    assert d.registries.tasks.owner("task_ep_b") == "ep_b"
    info = {i.name: i for i in d.plugin_infos()}["ep_a"]
    assert (info.distribution, info.version, info.module) == ("dare-plugin-ep_a", "1.2.3", "dare_fake_ep_a")
    assert info.hooks == ("dare_register_tasks",)


@pytest.mark.parametrize(
    "allow,deny,expected",
    [
        ("ep_a,ep_c", None, ["ep_a", "ep_c"]),
        (" ep_b , ", None, ["ep_b"]),
        ("none", None, []),
        (None, "ep_b", ["ep_a", "ep_c"]),
        (None, "ep_a,ep_c", ["ep_b"]),
        ("ep_a,ep_b", "ep_b", ["ep_a"]),  # the deny list applies after the allow list
    ],
)
def test_env_filtering(fake_entry_points, monkeypatch, allow, deny, expected):
    fake_entry_points("ep_a", "ep_b", "ep_c")
    if allow is not None:
        monkeypatch.setenv("DARE_PLUGINS", allow)
    if deny is not None:
        monkeypatch.setenv("DARE_DISABLE_PLUGINS", deny)
    assert _loaded(build(default_plugins=False)) == expected


def test_load_entrypoints_false_ignores_entry_points(fake_entry_points):
    fake_entry_points("ep_a", "ep_bad")
    assert _loaded(build(load_entrypoints=False, default_plugins=False)) == []


def test_a_plugin_that_fails_to_import_is_recorded_broken_and_the_others_load(fake_entry_points, monkeypatch):
    fake_entry_points("ep_a", "ep_bad")
    d = build(default_plugins=False)
    assert _loaded(d) == ["ep_a", "ep_bad"] and d.registries.tasks.names() == ["task_ep_a"]
    (bad,) = d.broken()
    assert bad.name == "ep_bad" and bad.hooks == () and bad.as_dict()["broken"] == bad.broken
    assert bad.broken.startswith("ModuleNotFoundError: ") and "dare_fake_missing_module_xyz" in bad.broken
    msg = bad.broken_message()
    assert "\n" not in msg and msg.startswith("plugin 'ep_bad' (?) is broken: ModuleNotFoundError")
    assert msg.endswith("reinstall it or disable it with DARE_DISABLE_PLUGINS=ep_bad")
    with pytest.raises(DareError, match="unknown task 'task_ep_bad'.*broken plugins, not loaded: 'ep_bad'"):
        d.registries.tasks.get("task_ep_bad")
    monkeypatch.setenv("DARE_DISABLE_PLUGINS", "ep_bad")  # the advice works
    d = build(default_plugins=False)
    assert _loaded(d) == ["ep_a"] and d.broken() == []


def test_strict_build_raises_one_line_naming_the_plugin(fake_entry_points):
    fake_entry_points("ep_a", "ep_bad")
    with pytest.raises(DareError) as info:
        build(default_plugins=False, strict=True)
    msg = str(info.value)
    assert "\n" not in msg
    assert "plugin 'ep_bad'" in msg and "dare_fake_missing_module_xyz" in msg
    assert "ModuleNotFoundError" in msg
    assert "DARE_DISABLE_PLUGINS=ep_bad" in msg


def test_a_multi_line_import_error_is_still_one_line(fake_entry_points, monkeypatch):
    class Broken(FakeEntryPoint):
        def load(self):
            raise ImportError("first line\n\nsecond line of advice")

    monkeypatch.setattr(
        dare_plugins.md, "entry_points", lambda *, group=None: [Broken("ep_broken", "dare_fake_broken")]
    )
    with pytest.raises(DareError) as info:
        build(default_plugins=False, strict=True)
    assert "\n" not in str(info.value)
    assert "first line second line of advice" in str(info.value)
    assert build(default_plugins=False).broken()[0].broken == "ImportError: first line second line of advice"


def _half_broken_plugin(calls):
    """Registers a task, a loss, then raises in its algorithm hook; observes ``dare_configure``."""

    def tasks(register):
        register(types.SimpleNamespace(name="half_task", description=""))

    def losses(register):
        register(ComponentSpec("half_loss", object, ""))

    def algorithms(register):
        raise RuntimeError("bad\nspec")

    def configure(config):
        calls.append(config)

    mod = types.ModuleType("half_broken")
    for hook, fn in [
        ("dare_register_tasks", tasks),
        ("dare_register_policy_losses", losses),
        ("dare_register_algorithms", algorithms),
        ("dare_configure", configure),
    ]:
        setattr(mod, hook, dare_plugins.hookimpl(fn))
    return mod


def test_a_registration_hook_that_raises_breaks_only_its_plugin(fake_entry_points):
    fake_entry_points("ep_a")
    calls = []
    d = build(extra_plugins=[_half_broken_plugin(calls)])
    (bad,) = d.broken()
    assert bad.name == "half_broken"
    assert bad.broken == "dare_register_algorithms raised RuntimeError: bad spec"
    assert "half_task" not in d.registries.tasks and "half_loss" not in d.registries.losses  # dropped
    assert d.registries.tasks.owner("task_ep_a") == "ep_a" and "clipped_pg" in d.registries.losses
    assert d.pm.get_plugin("half_broken") is None  # no lifecycle hooks either
    d.pm.hook.dare_configure.call_historic(kwargs={"config": "cfg"})
    assert calls == []
    with pytest.raises(RuntimeError, match="bad"):
        build(extra_plugins=[_half_broken_plugin(calls)], strict=True)


@pytest.mark.parametrize(
    "var,value,unknown,close",
    [
        ("DARE_PLUGINS", "ep_a,ep_bb", "ep_bb", "ep_b"),
        ("DARE_DISABLE_PLUGINS", "zzz", "zzz", None),
    ],
)
def test_an_unknown_plugin_id_in_the_load_variables_is_one_line(
    fake_entry_points, monkeypatch, var, value, unknown, close
):
    fake_entry_points("ep_a", "ep_b")
    monkeypatch.setenv(var, value)
    with pytest.raises(DareError) as info:
        build(default_plugins=False)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{var} names {unknown!r}, which is not an installed plugin")
    assert "installed: ep_a, ep_b" in msg
    assert (f"did you mean {close!r}?" in msg) if close else "did you mean" not in msg


# ----------------------------------------------------------------------------- lazy
def test_lazy_imports_its_target_on_first_call_only(monkeypatch):
    target = dare_plugins.lazy("json:JSONDecoder.decode")
    assert repr(target) == "lazy('json:JSONDecoder.decode')"
    mod = types.ModuleType("dare_fake_lazy_target")
    mod.made = []
    mod.make = lambda *a, **k: mod.made.append((a, k)) or len(mod.made)
    f = dare_plugins.lazy("dare_fake_lazy_target:make")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert f(1, x=2) == 1 and f() == 2 and mod.made == [((1,), {"x": 2}), ((), {})]
    monkeypatch.delitem(sys.modules, mod.__name__)
    assert f() == 3  # resolved once, kept


@pytest.mark.parametrize(
    "target,problem",
    [
        ("dare_fake_no_such_module:build", "ModuleNotFoundError: No module named 'dare_fake_no_such_module'"),
        ("json:no_such_attr", "AttributeError: module 'json' has no attribute 'no_such_attr'"),
    ],
)
def test_a_missing_lazy_target_is_one_line(target, problem):
    with pytest.raises(DareError) as info:
        dare_plugins.lazy(target)()
    assert str(info.value) == f"cannot load {target!r}: {problem}; reinstall the plugin that registers it"


@pytest.mark.parametrize("target", ["json", "json:", ":x", "a:b:c"])
def test_a_malformed_lazy_target_is_refused_at_registration(target):
    with pytest.raises(ValueError, match="package.module:attr"):
        dare_plugins.lazy(target)


def test_entry_point_and_extra_plugins_combine(fake_entry_points):
    fake_entry_points("ep_c")

    def reg(register):
        register(ComponentSpec("extra_loss", object, ""))

    mod = types.ModuleType("extra_mod")
    mod.dare_register_policy_losses = dare_plugins.hookimpl(reg)
    d = build(extra_plugins=[mod])
    assert d.registries.losses.owner("extra_loss") == "extra_mod"
    assert d.registries.tasks.owner("task_ep_c") == "ep_c"
    assert d.registries.losses.owner("clipped_pg") == "dare_core.default_plugins.components"


def test_an_example_distribution_is_marked(fake_entry_points):
    """A distribution whose keywords hold ``dare-example`` is an example; ``dare list`` marks
    what it registers."""
    from dare_core.listing import list_rows

    fake_entry_points("ep_a", "ep_c")
    dare = dare_plugins.build()
    assert dare.examples() == {"ep_c"}
    _, rows = list_rows(dare, "tasks")
    assert {r[0]: r[-1] for r in rows}["task_ep_c"] == "ep_c (example)"
    assert {r[0]: r[-1] for r in rows}["task_ep_a"] == "ep_a"
