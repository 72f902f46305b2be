"""The ``dare`` command line, on registries built from test plugins only."""

from __future__ import annotations

import json

import click
import pytest
import yaml
from click.testing import CliRunner

from dare_core import __version__
from dare_core.cli import cli


@pytest.fixture
def run(dare, use_dare):
    """``run(*args)`` → click result, with ``get_dare()`` returning the test registries."""
    use_dare(dare)
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, list(args), prog_name="dare")

    return invoke


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert result.stderr.strip() == lines[0]  # on stderr
    return lines[0]


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_plugins_json(run):
    result = run("plugins", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    by_name = {p["name"]: p for p in data}
    for p in data:
        assert {"name", "distribution", "version", "hooks"} <= set(p)
        assert isinstance(p["hooks"], list)
    assert by_name["dare_core.default_plugins.components"]["distribution"] == "dare-core"
    assert by_name["dare_core.default_plugins.components"]["version"] == __version__
    assert by_name["test_algorithms"]["hooks"] == ["dare_register_algorithms"]
    assert "dare_register_model_wrappers" in by_name["dare_core.testing.toy"]["hooks"]


def test_plugins_table(run):
    result = run("plugins")
    assert result.exit_code == 0
    header = result.output.splitlines()[0].split()
    assert header == ["plugin", "distribution", "version", "hooks"]
    assert "register_algorithms" in result.output and "test_algorithms" in result.output


def test_list_models(run):
    result = run("list", "models")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["model", "kind", "block"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"toy", "toy_block", "toy_cached"}
    assert rows["toy"][1] == "masked" and rows["toy"][-1] == "dare_core.testing.toy"
    assert rows["toy_block"][1:3] == ["block", "4"]
    assert "absorbing_elbo,bidirectional,kv_cache,mask_token" in rows["toy_cached"]


def test_list_algorithms(run):
    result = run("list", "algorithms")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("algo_a "))
    assert "rl" in row and "masked" in row and "test_algorithms" in row
    assert "corruption=random_ratio" in row and "loss=clipped_pg" in row
    cache = next(line for line in result.output.splitlines() if line.startswith("algo_cache "))
    assert "kv_cache" in cache and " any " in cache


def test_list_tasks_and_components(run):
    result = run("list", "tasks")
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.output.splitlines()[2:]]
    assert names == sorted(names) and {"echo_task", "sudoku"} <= set(names)
    for kind, name in [
        ("rollouts", "mini"),
        ("losses", "clipped_pg"),
        ("corruptions", "test_corruption"),
        ("estimators", "response_token_logprob"),
        ("advantages", "group_norm"),
        ("trajectories", "final_sequence"),
    ]:
        result = run("list", kind)
        assert result.exit_code == 0 and name in result.output, (kind, result.output)


def test_list_json(run):
    result = run("list", "tasks", "--json")
    data = json.loads(result.output)
    assert {"task": "echo_task", "description": "test task", "plugin": "test_tasks"} in data


def test_list_matrix(run):
    for args in (("list", "--matrix"), ("list",)):
        result = run(*args)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0].split() == ["algorithm", "toy", "toy_block", "toy_cached"]
        rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
        assert rows["algo_a"] == ["✓", "–", "✓"]
        assert rows["algo_block"] == ["–", "✓", "–"]
        assert rows["algo_cache"] == ["–", "–", "✓"]
        assert rows["algo_sft"] == ["✓", "✓", "✓"]
    data = json.loads(run("list", "--matrix", "--json").output)
    assert {"algorithm": "algo_cache", "toy": "–", "toy_block": "–", "toy_cached": "✓"} in data


def test_list_unknown_kind_is_a_usage_error(run):
    result = run("list", "widgets")
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_train_unknown_algorithm_is_one_line(run, load_calls):
    line = _one_error_line(run("train", "--algo", "d2", "--model", "toy"))
    assert "unknown algorithm 'd2'" in line and "installed: algo_a, algo_block" in line
    assert "pip install dare-plugin-d2" in line
    line = _one_error_line(run("train", "--algo", "algo_b", "--model", "toy"))
    assert "did you mean 'algo_a'?" in line
    line = _one_error_line(run("train", "--algo", "algo_a", "--model", "toys"))
    assert "unknown model 'toys'" in line and "did you mean 'toy'?" in line
    assert load_calls == []


def test_train_unsupported_combination_is_one_line_before_loading(run, load_calls, ckpt):
    line = _one_error_line(run("train", "--algo", "algo_cache", "--model", "toy", f"model.path={ckpt}"))
    assert "kv_cache" in line and "dare list --matrix" in line
    assert load_calls == []


def test_train_bad_config_file_lists_all_problems_in_one_line(run, load_calls, ckpt, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "trainer": {"lr": "fast", "stepz": 3, "batch_size": 0},
                "algorithm": {"clip_ratio_lo": 0.1},
            }
        )
    )
    line = _one_error_line(
        run("train", "--algo", "algo_a", "--model", "toy", "--config", str(path), f"model.path={ckpt}", "seed=x")
    )
    assert line.startswith("error: invalid configuration (5 problems): ")
    for needle in (
        "trainer.lr: expected float, got 'fast'",
        "trainer.stepz: unknown key (did you mean 'steps'?)",
        "trainer.batch_size: must be > 0, got 0",
        "seed: expected int, got 'x'",
        "algorithm.clip_ratio_lo: unknown key (did you mean 'clip_ratio_low'?)",
    ):
        assert needle in line
    assert load_calls == []


def test_train_missing_config_file_is_one_line(run, tmp_path):
    line = _one_error_line(run("train", "--algo", "algo_a", "--model", "toy", "--config", str(tmp_path / "nope.yaml")))
    assert "does not exist" in line


def test_config_show(run, ckpt):
    result = run("config", "show", "--algo", "algo_a", "--model", "toy", f"model.path={ckpt}", "trainer.steps=11")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "  steps: 11  # Number of training steps" in out
    assert "algorithm:  # Algorithm options" in out
    assert "  clip_ratio_low: 0.2  # PPO clip epsilon below 1." in out
    assert "  backend: low_confidence  # Rollout backend." in out
    data = yaml.safe_load(out)
    assert data["algo"] == "algo_a" and data["model"]["path"] == str(ckpt)


def test_config_show_prints_plugin_sections_with_their_description(make_dare, make_plugin, use_dare, ckpt):
    import attrs

    from dare_core.config import option
    from dare_core.interfaces import ConfigSection

    @attrs.frozen
    class WatchConfig:
        every: int = option(10, "Watch every N steps.")

    use_dare(
        make_dare(
            make_plugin(
                "test_watch",
                dare_register_config_sections=lambda register: register(
                    ConfigSection("watch", WatchConfig, "The watcher's options.")
                ),
            )
        )
    )
    result = CliRunner().invoke(
        cli,
        ["config", "show", "--algo", "algo_a", "--model", "toy", f"model.path={ckpt}", "watch.every=3"],
        prog_name="dare",
    )
    assert result.exit_code == 0, result.output
    assert "\nwatch:  # The watcher's options.\n  every: 3  # Watch every N steps.\n" in result.output
    assert yaml.safe_load(result.output)["watch"] == {"every": 3}


def test_config_show_errors_are_one_line(run, ckpt):
    line = _one_error_line(
        run(
            "config",
            "show",
            "--algo",
            "algo_a",
            "--model",
            "toy",
            f"model.path={ckpt}",
            "algorithm.nope=1",
            "trainer.lr=-1",
        )
    )
    assert "algorithm.nope: unknown key" in line and "trainer.lr: must be > 0" in line


def test_plugin_commands(run):
    result = run("hello", "--name", "dare")
    assert result.exit_code == 0 and result.output == "hello dare\n"
    assert "hello" in run("--help").output


def _clash(make_plugin, plugin_name, command_name):
    @click.command(command_name)
    def cmd():
        click.echo("clash")

    def register(cli):
        cli.add_command(cmd)

    return make_plugin(plugin_name, dare_register_commands=register)


def test_plugin_command_may_not_replace_a_builtin(make_dare, use_dare, make_plugin):
    use_dare(make_dare(_clash(make_plugin, "sneaky", "list")))
    result = CliRunner().invoke(cli, ["hello"])
    line = _one_error_line(result)
    assert "plugin 'sneaky' adds the command 'list'" in line and "'dare-core'" in line
    assert cli.commands["list"].callback.__name__ == "list_cmd"  # the built-in is kept


def test_two_plugins_may_not_add_the_same_command(make_dare, use_dare, make_plugin):
    use_dare(make_dare(_clash(make_plugin, "second_hello", "hello")))
    line = _one_error_line(CliRunner().invoke(cli, ["hello"]))
    assert "plugin 'second_hello' adds the command 'hello', which 'test_commands' already provides" in line


@pytest.mark.parametrize(("command", "dist"), [("eval", "dare-plugin-eval"), ("plot", "dare-plugin-report")])
def test_a_first_party_command_not_installed_names_its_distribution(run, command, dist):
    """With only the core's registries, ``dare eval`` names the distribution and the pip command."""
    line = _one_error_line(run(command, "--help"))
    assert line == f"error: the command {command!r} comes with {dist}, which is not installed: pip install {dist}"


def test_an_unknown_command_is_still_a_usage_error(run):
    line = _one_error_line(run("trian"))
    assert "No such command 'trian'" in line and "train" in line
