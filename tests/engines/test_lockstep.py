"""Lockstep generation under engines whose forwards are collective (docs/engines.md, "Lockstep"):
every family's default rollout backend and ``fast`` with threshold decoding, on 2 gloo ranks whose
prompts finish after different numbers of forwards, give the 1-process responses under ``fsdp`` and
DeepSpeed ZeRO-3 with every parameter partitioned; an RL run with evaluation of an odd number of
items (greedy and sampled) equals the 1-process run on both engines."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the spawned ranks import lockstep_runs by name
from lockstep_runs import CASES, ENGINE_PLUGINS, rollouts, train_jobs, write_zero3  # noqa: E402

from dare_core.testing.distributed import free_port, run_ranks  # noqa: E402
from dare_core.testing.engines import max_weight_diff, same_records  # noqa: E402

pytest.importorskip("deepspeed")
for _module in sorted({*ENGINE_PLUGINS, *(case[0] for case in CASES.values())}):
    pytest.importorskip(_module)  # an integration of plugins: skipped where one is not installed

#: cases whose two prompts take different numbers of forwards (checked: the test is not vacuous)
UNEQUAL = ("llada-fast", "sdar", "llada2")
FSDP, DEEPSPEED = ENGINE_PLUGINS


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("lockstep")
    os.makedirs(path / "ckpt")
    write_zero3(str(path))
    return path


def test_every_default_backend_steps_in_lockstep_under_fsdp_and_zero3(root):
    ranks = run_ranks(2, rollouts, str(root), list(CASES), [(e, free_port()) for e in ("fsdp", "zero3")])
    for key in ranks[0]:
        case = key.split("/")[1]
        if case == "diffusiongemma":  # its encoder runs on its decoder's layers (fsdp cannot
            # shard them); transformers' generate bypasses the module's forward (no lockstep)
            refusal = "cannot shard it" if key.startswith("fsdp/") else "cannot step in lockstep"
            assert all(refusal in r[key]["refused"] for r in ranks), key
            continue
        assert all(r[key]["same"] for r in ranks), key
        if case in UNEQUAL:
            assert ranks[0][key]["forwards"] != ranks[1][key]["forwards"], key


def _run(common, name, model, *extra):
    return (free_port(), (f"dare_plugin_{model}", FSDP, DEEPSPEED), model, [*common, f"run_name={name}", *extra])


def test_rl_and_odd_evaluation_on_two_ranks_equal_one_process(root):
    """``fast`` threshold decoding on the bundled LLaDA, and the default backends of SDAR and
    LLaDA2: one RL step, evaluations of 3 items in batches of 1 (rank 1 pads) before and after,
    greedy and sampled (LLaDA)."""
    common = [
        "task.name=digits",
        "rollout.gen_length=4",
        "rollout.steps=4",
        "rollout.temperature=1.0",
        "progress=false",
        "seed=3",
        "trainer.steps=1",
        "trainer.batch_size=2",
        "trainer.group_size=2",
        "trainer.micro_batch_size=2",
        "trainer.rollout_batch_size=1",
        "model.device=cpu",
        "task.num_eval=3",
        "eval.batch_size=1",
        f"output_dir={root / 'runs'}",
        "model.cross_entropy=naive",
    ]
    zero3 = ["engine.name=deepspeed", "deepspeed.zero_stage=3", f"deepspeed.config={root / 'zero3.json'}"]
    fast = ["rollout.backend=fast", "rollout.decoding=threshold", "rollout.threshold=0.3", "rollout.block_length=4"]
    jobs = {
        "greedy": ("llada", *fast),
        "sampled": ("llada", *fast, "eval.temperature=1.0"),
        "sdar": ("sdar",),
        "llada2": ("llada2", "rollout.threshold=0.3"),
    }
    one = run_ranks(1, train_jobs, [_run(common, f"one-{n}", *o) for n, o in jobs.items()])[0]
    many = run_ranks(
        2,
        train_jobs,
        [
            _run(common, f"{e}-{n}", *o, *eng)
            for n, o in jobs.items()
            for e, eng in (("fsdp", ["engine.name=fsdp"]), ("zero3", zero3))
        ],
    )[0]
    for i, single in enumerate(one):
        for sharded in many[2 * i : 2 * i + 2]:
            assert max_weight_diff(single["weights"], sharded["weights"]) <= 1e-6, list(jobs)[i]
            untimed = [
                [{k: v for k, v in r.items() if k != "eval"} for r in run["records"]] for run in (single, sharded)
            ]
            problems = same_records(*untimed)
            assert not problems, "\n".join(problems[:10])
            assert single["samples"] == sharded["samples"]
            for label in ("before", "after"):
                got, want = sharded["eval"][label], single["eval"][label]
                assert got["n"] == 3 and got["nfe"] == want["nfe"]
                for key in ("accuracy", "reward"):
                    assert got[key] == pytest.approx(want[key], abs=1e-12)
