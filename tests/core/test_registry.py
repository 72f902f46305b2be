"""Named registries: owners, duplicates, unknown names."""

from __future__ import annotations

import pytest

from dare_core.errors import DareError, DuplicateNameError, UnknownNameError
from dare_core.interfaces import ComponentSpec
from dare_core.plugins import build
from dare_core.registry import Registries, Registry, plugin_dist_hint


def _spec(name: str) -> ComponentSpec:
    return ComponentSpec(name, object, f"{name} component")


def test_register_get_owner_and_sorted_names():
    reg = Registry("widget")
    for name in ("zeta", "alpha", "mid"):
        reg.register(name, _spec(name), owner="plug_" + name)
    assert reg.names() == ["alpha", "mid", "zeta"]
    assert [n for n, _ in reg.items()] == ["alpha", "mid", "zeta"]
    assert reg.get("mid").name == "mid"
    assert reg.owner("zeta") == "plug_zeta"
    assert "alpha" in reg and "nope" not in reg
    assert len(reg) == 3
    assert "alpha" in repr(reg)


def test_duplicate_name_by_two_plugins_names_both():
    reg = Registry("policy loss")
    reg.register("dup", _spec("dup"), owner="plugin_one")
    with pytest.raises(DuplicateNameError) as info:
        reg.register("dup", _spec("dup"), owner="plugin_two")
    msg = str(info.value)
    assert "'dup'" in msg and "plugin_one" in msg and "plugin_two" in msg
    assert "DARE_DISABLE_PLUGINS=plugin_two" in msg
    assert "\n" not in msg
    assert isinstance(info.value, DareError)
    assert reg.owner("dup") == "plugin_one"  # the first registration is kept


def test_same_plugin_re_registering_the_same_object_is_fine():
    reg = Registry("corruption")
    spec = _spec("same")
    reg.register("same", spec, owner="p")
    reg.register("same", spec, owner="p")
    assert reg.names() == ["same"] and reg.get("same") is spec


def test_same_plugin_registering_another_object_under_a_taken_name_fails():
    reg = Registry("corruption")
    reg.register("same", _spec("same"), owner="p")
    with pytest.raises(DuplicateNameError):
        reg.register("same", _spec("same"), owner="p")


@pytest.mark.parametrize("bad", ["", None, 3])
def test_names_must_be_non_empty_strings(bad):
    with pytest.raises(ValueError):
        Registry("model").register(bad, object(), owner="p")


def test_unknown_name_is_one_line_with_installed_close_match_and_install_hint():
    reg = Registry("algorithm", hint_install=True)
    for name in ("algo_a", "algo_sft", "other"):
        reg.register(name, _spec(name), owner="p")
    with pytest.raises(UnknownNameError) as info:
        reg.get("algo_b")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("unknown algorithm 'algo_b'")
    assert "installed: algo_a, algo_sft, other" in msg
    assert "did you mean 'algo_a'?" in msg
    assert "pip install dare-plugin-algo-b" in msg
    # a KeyError for callers that expect one, but not quoted like a KeyError
    assert isinstance(info.value, KeyError) and isinstance(info.value, DareError)
    assert not msg.startswith('"')


def test_unknown_name_without_close_match_or_install_hint():
    reg = Registry("policy loss", hint_install=False)
    reg.register("clipped", _spec("clipped"), owner="p")
    msg = reg.unknown_message("zzzzzz")
    assert "installed: clipped" in msg
    assert "did you mean" not in msg and "pip install" not in msg


def test_a_name_in_another_case_is_suggested_without_an_install_hint():
    """``--model LLaDA`` names ``llada``, and no distribution called dare-plugin-LLaDA."""
    reg = Registry("model")
    for name in ("llada", "llada2", "dream"):
        reg.register(name, _spec(name), owner="p")
    msg = reg.unknown_message("LLaDA")
    assert "did you mean 'llada'?" in msg and "pip install" not in msg
    assert "did you mean 'dream'?" in reg.unknown_message("DREEM")


def test_unknown_name_in_an_empty_registry():
    msg = Registry("model").unknown_message("fam")
    assert "installed: none" in msg and "pip install dare-plugin-fam" in msg


def test_plugin_dist_hint_uses_dashes():
    assert plugin_dist_hint("my_algo") == "dare-plugin-my-algo"


def test_registries_kinds_and_unknown_registry():
    regs = Registries()
    assert regs["models"] is regs.models and regs["advantages"].kind == "advantage estimator"
    assert regs.models.hint_install and regs.algorithms.hint_install
    assert not regs.losses.hint_install
    with pytest.raises(UnknownNameError, match="valid: .*losses"):
        regs["lossez"]


def test_build_reports_duplicates_across_plugins_naming_both(make_plugin):
    def reg_one(register):
        register(_spec("shared"))

    first = make_plugin("first_plugin", dare_register_policy_losses=reg_one)
    second = make_plugin("second_plugin", dare_register_policy_losses=reg_one)
    with pytest.raises(DuplicateNameError) as info:
        build(load_entrypoints=False, extra_plugins=[first, second])
    msg = str(info.value)
    # registration order: the first plugin owns the name, the later one is named for disabling
    assert "by plugin 'first_plugin' and by plugin 'second_plugin'" in msg
    assert "DARE_DISABLE_PLUGINS=second_plugin" in msg


def test_build_duplicate_of_a_core_component_blames_the_plugin(make_plugin):
    def reg(register):
        register(ComponentSpec("clipped_pg", object, "a clash with the core's loss"))

    with pytest.raises(DuplicateNameError) as info:
        build(load_entrypoints=False, extra_plugins=[make_plugin("clashing", dare_register_policy_losses=reg)])
    assert "DARE_DISABLE_PLUGINS=clashing" in str(info.value)
    assert "dare_core.default_plugins.components" in str(info.value)


def test_a_plugin_may_register_the_same_spec_twice(make_plugin):
    spec = _spec("twice")

    def reg(register):
        register(spec)
        register(spec)

    d = build(
        load_entrypoints=False,
        default_plugins=False,
        extra_plugins=[make_plugin("twice_plugin", dare_register_policy_losses=reg)],
    )
    assert d.registries.losses.names() == ["twice"]


def test_a_spec_without_name_is_refused(make_plugin):
    def reg(register):
        register(object())

    with pytest.raises(TypeError, match="nameless_plugin"):
        build(
            load_entrypoints=False, strict=True, extra_plugins=[make_plugin("nameless_plugin", dare_register_tasks=reg)]
        )
    d = build(load_entrypoints=False, extra_plugins=[make_plugin("nameless_plugin", dare_register_tasks=reg)])
    assert "registered a task without a name" in d.broken()[0].broken
