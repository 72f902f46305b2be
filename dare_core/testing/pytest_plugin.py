"""pytest fixtures for DARE plugin authors (auto-loaded via the ``pytest11`` entry point)."""

from __future__ import annotations

import pytest
import torch

from dare_core.testing.registries import build_for
from dare_core.testing.toy import fake_rollout, make_toy_wrapper


@pytest.fixture
def dare_build():
    """``dare_build(*plugins)`` → registries from the core's defaults, ``plugins`` and the DARE
    plugins their distributions require (:func:`dare_core.testing.registries.build_for`)."""

    def make(*plugins, entrypoints: bool = False):
        return build_for(*plugins, entrypoints=entrypoints)

    return make


@pytest.fixture
def dare_cli(monkeypatch):
    """``dare_cli(dare)`` → ``invoke(*args)``: runs ``dare ARGS`` (click's ``CliRunner``) with the
    registries ``dare`` and the commands its plugins register; undone after the test."""
    from click.testing import CliRunner

    import dare_core.plugins as plugins
    from dare_core.cli import cli

    def use(dare):
        monkeypatch.setattr(cli, "commands", dict(cli.commands))
        monkeypatch.setattr(cli, "_plugins_loaded", False, raising=False)
        monkeypatch.setattr(plugins, "_DARE", dare)
        return lambda *args: CliRunner().invoke(cli, list(args), prog_name="dare")

    return use


@pytest.fixture
def toy_wrapper():
    """A fresh family-free tiny masked-diffusion wrapper (character tokenizer)."""
    return make_toy_wrapper()


@pytest.fixture
def toy_rollout(toy_wrapper):
    """A random :class:`~dare_core.interfaces.RolloutBatch` for ``toy_wrapper``."""
    return fake_rollout(toy_wrapper)


@pytest.fixture
def torch_generator():
    return torch.Generator().manual_seed(0)
