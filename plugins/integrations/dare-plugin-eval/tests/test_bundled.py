"""``dare eval`` on the bundled tiny LLaDA checkpoint with real tasks: several tasks in one run
give each task's numbers alone; the single-task command and its JSON."""

import json
import os

import pytest

import dare_plugin_eval
import dare_plugin_llada
from dare_core.testing.registries import build_for
from dare_plugin_eval.suite import run_suite
from dare_plugin_llada.wrapper import BUNDLED

pytestmark = pytest.mark.skipif(not os.path.isdir(BUNDLED), reason="needs the bundled checkpoint")

#: two prompts per task, 4 denoising steps (the prompt length is sized to each task)
TINY = ["task.num_eval=2", "eval.steps=4", "eval.batch_size=2", "progress=false"]


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_llada, dare_plugin_eval)


def test_several_tasks_equal_each_task_alone(dare, tmp_path):
    tasks = ["sudoku", "countdown", "humaneval"]
    overrides = [*TINY, f"output_dir={tmp_path}"]
    both = run_suite(dare, "llada", tasks, overrides=overrides)["tasks"]
    assert list(both) == tasks and both["humaneval"]["kinds"] and "kinds" not in both["sudoku"]
    for task in tasks:
        (alone,) = run_suite(dare, "llada", [task], overrides=overrides)["tasks"].values()
        assert {k: v for k, v in alone.items() if k != "seconds"} == {
            k: v for k, v in both[task].items() if k != "seconds"
        }


def test_each_task_is_sized_to_the_model_and_one_that_cannot_fit_is_skipped(dare, dare_cli, tmp_path):
    """HumanEval's prompts (331 tokens) exceed the checkpoint preset's trainer.max_prompt_length
    (256) but fit the model's context (1,024), so they run; MBPP's 3-shot prompts (1,586 tokens)
    cannot fit: one line names the task, its longest prompt, the context and the fix, and the
    other tasks still run. Alone, MBPP is refused in that line before the model loads."""
    result = dare_cli(dare)(
        "eval", "--model", "llada", "--tasks", "mbpp,humaneval,sudoku", *TINY, f"output_dir={tmp_path}"
    )
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()[2:4]] == ["humaneval", "sudoku"]
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped: ")]
    assert skipped == [
        "skipped: task 'mbpp': its longest prompt has 1586 tokens, which with rollout.gen_length=40 exceeds "
        "the model's context of 1024 tokens (max_sequence_length in config.json); give shorter prompts "
        "(fewer shots) or lower rollout.gen_length"
    ]
    results = json.loads(open(os.path.join(tmp_path, os.listdir(tmp_path)[0], "results.json")).read())
    assert list(results["tasks"]) == ["humaneval", "sudoku"] and list(results["skipped"]) == ["mbpp"]
    # the recorded config is the first task that ran, its prompt length sized to the context
    assert results["config"]["task"]["name"] == "humaneval"
    assert results["config"]["trainer"]["max_prompt_length"] == 1024 - 40
    alone = dare_cli(dare)("eval", "--model", "llada", "--tasks", "mbpp", *TINY, f"output_dir={tmp_path / 'b'}")
    assert alone.exit_code == 2 and alone.stderr.strip() == "error: " + skipped[0][len("skipped: ") :]
    assert not os.path.exists(tmp_path / "b")


def test_dare_eval_json(dare, dare_cli, tmp_path):
    result = dare_cli(dare)(
        "eval", "--model", "llada", "--json", "task.num_eval=6", "eval.batch_size=4", f"output_dir={tmp_path}"
    )
    assert result.exit_code == 0, result.output
    rec = json.loads(result.stdout.strip().splitlines()[-1])
    m = rec["tasks"]["sudoku"]
    assert m["n"] == 6 and 0.0 <= m["accuracy"] <= 1.0 and m["nfe"] == 2 * 20  # two batches x 20 steps
    assert os.path.isfile(os.path.join(rec["eval_dir"], "samples.jsonl"))


def test_multiple_choice_is_scored_by_likelihood(dare, tmp_path):
    """A task whose items carry choices is answered by the Monte-Carlo ELBO of each choice:
    the suite's picks are choose()'s, and the tiny Sudoku model prefers the right grids."""
    import dare_plugin_tasks
    from dare_core.config import resolve
    from dare_core.workflows.runtime import eval_context
    from dare_objectives.likelihood import choose

    data = os.path.join(
        os.path.dirname(dare_plugin_tasks.__file__), "..", "..", "tests", "data", "multiple_choice_tiny.jsonl"
    )
    dare = build_for(dare_plugin_llada, dare_plugin_eval, dare_plugin_tasks)
    overrides = [f"task.eval_path={data}", "task.num_eval=10", "progress=false", f"output_dir={tmp_path}"]
    res = run_suite(dare, "llada", ["multiple_choice"], overrides=overrides, mc_samples=8)
    m = res["tasks"]["multiple_choice"]
    assert m["n"] == 10 and m["accuracy"] >= 0.7
    with open(os.path.join(res["eval_dir"], "samples.jsonl")) as fh:
        picks = [int(json.loads(line)["pred"]) for line in fh]
    ctx = eval_context(
        dare, resolve(dare, model="llada", need_algo=False, overrides=[*overrides, "task.name=multiple_choice"])
    )
    examples = ctx.task.examples("eval", limit=10, seed=0)
    assert picks == choose(ctx.wrapper, examples, samples=8, seed=0)
