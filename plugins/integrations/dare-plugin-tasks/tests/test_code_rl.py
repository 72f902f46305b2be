"""Code tasks as RL rewards: a coupled-GRPO run on MBPP with the sandbox reward, and VRPO-style
preference pairs built from sandbox-graded responses."""

from __future__ import annotations

import json

import pytest

from dare_core.config import TaskConfig
from dare_plugin_tasks.parquet import MBPPTask

GOOD = '[BEGIN]\n \'def remove_Occ(s,ch): \r\n    return s.replace(ch, "", 1)[::-1].replace(ch, "", 1)[::-1]\' \n[DONE]'
WRONG = "```python\ndef remove_Occ(s, ch):\n    return s.replace(ch, '', 1)\n```"  # only the first occurrence
BROKEN = "```python\ndef remove_Occ(s, ch) return s\n```"


def test_mbpp_reward_is_pass_fail_by_the_sandbox():
    task = MBPPTask(TaskConfig(name="mbpp"))
    ex = task.examples("eval", limit=1)[0]
    assert [(s.score, s.acc, s.kind) for s in (task.score(ex, r) for r in (GOOD, WRONG, BROKEN))] == [
        (1.0, 1.0, "passed"),
        (0.0, 0.0, "wrong"),
        (0.0, 0.0, "error"),
    ]


def test_preference_pairs_from_sandbox_graded_code():
    pairs_mod = pytest.importorskip("dare_plugin_preference.pairs")
    task = MBPPTask(TaskConfig(name="mbpp"))
    ex = task.examples("eval", limit=1)[0]
    texts = [WRONG, GOOD, BROKEN]
    scores = [task.score(ex, t) for t in texts]
    (pair,) = pairs_mod.pairs_from_scores([ex], texts, scores, 3, require_correct=True)
    assert pair.chosen == GOOD and pair.rejected == WRONG  # the first of the worst is rejected
    assert pair.meta["chosen_acc"] == 1.0 and pair.meta["rejected_acc"] == 0.0
    assert pair.meta["data_source"] == "mbpp"
    # all three failing: no preference, no pair
    assert (
        pairs_mod.pairs_from_scores(
            [ex], [WRONG, BROKEN, WRONG + " "], [task.score(ex, t) for t in (WRONG, BROKEN, WRONG)], 3
        )
        == []
    )


def test_coupled_grpo_trains_dream_on_mbpp(tmp_path, dare_cli):
    pytest.importorskip("dare_plugin_dream")
    pytest.importorskip("dare_plugin_coupled_grpo")
    from dare_core.api import get_dare

    # the bundled tiny Dream checkpoint has a 1,024-token context and a Sudoku tokenizer: MBPP's
    # 3-shot prompts do not fit, so the run uses each item's own (last) user turn
    data = tmp_path / "mbpp.jsonl"
    with open(data, "w") as fh:
        for ex in MBPPTask(TaskConfig(name="mbpp")).examples("eval", limit=4):
            user = [m for m in ex.prompt if m["role"] == "user"][-1]
            fh.write(
                json.dumps(
                    {
                        "data_source": "mbpp",
                        "prompt": [user],
                        "reward_model": {"ground_truth": ex.ground_truth},
                        "extra_info": ex.extra_info,
                    }
                )
                + "\n"
            )
    res = dare_cli(get_dare())(
        "train",
        "--algo",
        "coupled_grpo",
        "--model",
        "dream",
        "task.name=mbpp",
        f"task.train_path={data}",
        f"task.eval_path={data}",
        "task.num_eval=2",
        "trainer.steps=1",
        "trainer.batch_size=2",
        "trainer.group_size=2",
        "trainer.micro_batch_size=4",
        "trainer.max_prompt_length=1000",
        "rollout.gen_length=16",
        "rollout.steps=4",
        "eval.steps=4",
        "eval.before=false",
        "progress=false",
        f"output_dir={tmp_path}",
        "run_name=r",
    )
    assert res.exit_code == 0, res.output
    metrics = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 1 and "reward" in metrics[0]
    samples = json.loads((tmp_path / "r" / "eval_samples" / "after.json").read_text())
    assert len(samples) == 2 and all(s["score"] in (0.0, 1.0) for s in samples)


def test_code_fences_and_prose_around_the_program():
    task = MBPPTask(TaskConfig(name="mbpp"))
    ex = task.examples("eval", limit=1)[0]
    good = "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]\n"
    fenced = f"Here it is:\n```python\n{good}```\nIt removes the first and last occurrence."
    assert task.score(ex, fenced).kind == "passed"
    assert task.score(ex, f"```\n{good}```").kind == "passed"  # bare fence
    last_wins = f"```python\n{good}```\n```python\nremove_Occ = None\n```"
    assert task.score(ex, last_wins).kind != "passed"  # the last python block is the program
    assert task.score(ex, f"```text\nnot code\n```\n```py\n{good}```").kind == "passed"
