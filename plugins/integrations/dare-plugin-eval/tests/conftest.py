"""Fixtures of the suite's tests: the toy registries of :mod:`dare_plugin_eval.testing` and
``dare eval`` run with them."""

from __future__ import annotations

import pytest

from dare_core.testing.registries import build_for
from dare_plugin_eval.testing import PLUGINS, TINY, plugin


@pytest.fixture
def dare():
    return build_for(*map(plugin, PLUGINS))


@pytest.fixture
def overrides(tmp_path):
    return [*TINY, f"model.path={tmp_path / 'ckpt'}", f"output_dir={tmp_path / 'out'}"]


@pytest.fixture
def dare_eval(dare, dare_cli):
    """``dare_eval(*args)``: the result of ``dare eval ARGS`` with the toy registries."""
    invoke = dare_cli(dare)
    return lambda *args: invoke("eval", "--model", "toy", *args)
