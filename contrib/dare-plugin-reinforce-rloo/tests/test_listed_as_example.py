"""The distribution declares itself an example (``keywords = ["dare-example"]``), so ``dare list``
and ``dare plugins`` mark what it registers; the first-party plugins are not marked."""

from click.testing import CliRunner

from dare_core.cli import cli
from dare_core.plugins import build


def test_the_installed_distribution_is_listed_as_an_example(monkeypatch):
    dare = build()
    info = next(i for i in dare.plugin_infos() if i.name == "reinforce_rloo")
    assert info.example and info.distribution == "dare-plugin-reinforce-rloo"
    assert not any(i.example for i in dare.plugin_infos() if i.builtin)
    monkeypatch.setattr("dare_core.plugins._DARE", dare)
    listed = CliRunner().invoke(cli, ["list", "algorithms"]).output
    row = next(line for line in listed.splitlines() if line.startswith("reinforce_rloo"))
    assert row.rstrip().endswith("reinforce_rloo (example)")
    matrix = CliRunner().invoke(cli, ["list", "--matrix"]).output
    assert any(line.startswith("reinforce_rloo (example)") for line in matrix.splitlines())
