"""``engine.name=fsdp`` on 2 gloo ranks against the single-process engine on the toy model and
the digits task (the testing kit's tiny runs): supervised, RL, a Monte-Carlo accumulation loss
(BGPO) and LoRA give the same weights (within 1e-6) and per-step metrics; bf16-mixed updates
reach the fp32 master weights; a run resumed from a checkpoint, on 2 ranks or on one, equals the
uninterrupted run.

The runs are trained once per module in two batches (one process set each, see
:mod:`fsdp_runs`); the tests check their results.
"""

from __future__ import annotations

import os

import pytest
import torch
from fsdp_runs import FSDP, train_batch

from dare_core.testing.engines import max_weight_diff, same_records

BGPO = ("dare_plugin_bgpo", ["algorithm.mc_num=2", "algorithm.n_l=2"])
LORA = ["model.lora.rank=2", "model.lora.target_modules=[mlp.0,mlp.2]"]
#: an update far below bf16's resolution around the toy's weights (lost without fp32 masters)
SMALL_LR = ["trainer.lr=5e-7"]
PURE_BF16 = ["engine.precision=bf16", "engine.bf16_update=kahan"]

SINGLE_JOBS = {
    "sup": ((), "sup_test", []),
    "pg": ((), "pg_test", []),
    "bgpo": ((BGPO[0],), "bgpo", BGPO[1]),
    "lora": ((), "pg_test", LORA),
    "bf16": ((), "sup_test", PURE_BF16),
}
FSDP_JOBS = {
    "sup": ((FSDP,), "sup_test", ["engine.name=fsdp"]),
    "pg": ((FSDP,), "pg_test", ["engine.name=fsdp"]),
    "bgpo": ((FSDP, BGPO[0]), "bgpo", ["engine.name=fsdp", *BGPO[1]]),
    "lora": ((FSDP,), "pg_test", ["engine.name=fsdp", *LORA]),
    "bf16": ((FSDP,), "sup_test", ["engine.name=fsdp", *PURE_BF16]),
    # on the CPU the offloaded shards stay where they are: the policy's code path, same numbers
    "offload": ((FSDP,), "sup_test", ["engine.name=fsdp", "fsdp.cpu_offload=true", "fsdp.reshard_after_forward=false"]),
    "fp32_small": ((FSDP,), "sup_test", ["engine.name=fsdp", *SMALL_LR]),
    "bf16_small": ((FSDP,), "sup_test", ["engine.name=fsdp", "engine.precision=bf16-mixed", *SMALL_LR]),
    # 2 of pg's 3 steps with a checkpoint after each (the fixture adds the files to remove
    # before the resume: what a run killed after step 2 would not have written), then resumed
    "cut": ((FSDP,), "pg_test", ["engine.name=fsdp", "trainer.save_every=1", "trainer.steps=2"]),
    "resumed": (
        (FSDP,),
        "pg_test",
        ["engine.name=fsdp", "trainer.save_every=1", "run_name=cut", "trainer.resume=auto"],
    ),
    "cut_for_one": ((FSDP,), "pg_test", ["engine.name=fsdp", "trainer.save_every=1", "trainer.steps=2"]),
}
#: the 2-rank checkpoint of step 2 continued on one process (the state resharded)
ONE_JOBS = {
    "resumed_on_one": (
        (FSDP,),
        "pg_test",
        ["engine.name=fsdp", "trainer.save_every=1", "run_name=cut_for_one", "trainer.resume=auto"],
    ),
}
#: what a finished run writes at its end, relative to its run directory
FINISHED = ("summary.json",)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    single = train_batch(1, SINGLE_JOBS, [f"model.path={tmp / 'ckpt'}", f"output_dir={tmp / 'single'}"])
    jobs = dict(FSDP_JOBS)
    jobs["resumed"] = (*jobs["resumed"], [str(tmp / "fsdp" / "cut" / f) for f in FINISHED])
    sharded = train_batch(2, jobs, [f"model.path={tmp / 'ckpt'}", f"output_dir={tmp / 'fsdp'}"])
    one = dict(ONE_JOBS)
    one["resumed_on_one"] = (*one["resumed_on_one"], [str(tmp / "fsdp" / "cut_for_one" / f) for f in FINISHED])
    sharded.update(train_batch(1, one, [f"model.path={tmp / 'ckpt'}", f"output_dir={tmp / 'fsdp'}"]))
    return single, sharded


def _assert_same(one, many, atol=1e-6):
    diff = max_weight_diff(one["weights"], many["weights"])
    assert diff <= atol, f"weights differ by {diff:.3g}"
    problems = same_records(one["records"], many["records"])
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("name", ["sup", "pg", "bgpo", "lora", "bf16"])
def test_two_ranks_equal_one_process(runs, name):
    """``bf16``: bf16 weight shards with the Kahan-compensated AdamW (gradients reduced in
    fp32), against the same policy in one process."""
    single, sharded = runs
    _assert_same(single[name], sharded[name])
    assert len([r for r in sharded[name]["records"] if "loss" in r]) == 3
    assert sharded[name]["summary"]["world_size"] == 2
    assert single[name]["summary"]["world_size"] == 1


def test_cpu_offload_and_keeping_layers_gathered_change_no_number(runs):
    single, sharded = runs
    _assert_same(single["sup"], sharded["offload"])


def test_the_exported_checkpoint_loads_with_the_family_loader(runs):
    from dare_core.testing.toy import load

    single, sharded = runs
    final = os.path.join(sharded["sup"]["run_dir"], "final")
    module = load(final).module
    diff = max_weight_diff(module.state_dict(), single["sup"]["weights"])
    assert diff <= 1e-6


def test_the_lora_export_is_a_peft_adapter_of_the_base(runs):
    """Only the adapter matrices are exported (consolidated on rank 0); PEFT loads them onto the
    base model."""
    from peft import PeftModel

    from dare_core.testing.toy import make_toy_wrapper

    single, sharded = runs
    weights = sharded["lora"]["weights"]
    assert weights and all("lora_" in k for k in weights)
    adapter = os.path.join(sharded["lora"]["run_dir"], "final", "lora_adapter")
    model = PeftModel.from_pretrained(make_toy_wrapper().module, adapter)
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert sorted(loaded) == sorted(weights) and len(weights) == 4  # A and B of mlp.0 and mlp.2
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key
    assert max_weight_diff(weights, single["lora"]["weights"]) <= 1e-6


def test_bf16_mixed_updates_reach_the_fp32_master_weights(runs):
    """At lr 5e-7 every Adam step moves a weight by ~5e-7, below bf16's resolution: the
    bf16-mixed run moves the weights as the fp32 run does (bf16 compute, fp32 shards)."""
    from dare_core.testing.toy import make_toy_wrapper

    _, sharded = runs
    start = make_toy_wrapper().module.state_dict()

    def delta(run):
        return torch.cat([(run["weights"][k].float() - start[k].float()).flatten() for k in start])

    d32, d16 = delta(sharded["fp32_small"]), delta(sharded["bf16_small"])
    assert all(v.dtype == torch.float32 for v in sharded["bf16_small"]["weights"].values())
    assert float(d32.norm()) > 0
    assert float(d16.abs().max()) < 1e-5  # three steps of about lr each
    assert 0.8 < float(d16.norm() / d32.norm()) < 1.25
    assert float(torch.nn.functional.cosine_similarity(d16, d32, dim=0)) > 0.9
    losses = [r["loss"] for r in sharded["bf16_small"]["records"] if "loss" in r]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_a_resumed_run_equals_the_uninterrupted_run(runs):
    """The engine's state (parameter and optimizer shards, torch.distributed.checkpoint) saved
    at step 2 and loaded by the resumed run: steps 1-3 equal the run without interruption."""
    _, sharded = runs
    _assert_same(sharded["pg"], sharded["resumed"])
    state = os.path.join(sharded["resumed"]["run_dir"], "checkpoints", "step-2", "state")
    assert sorted(os.listdir(state)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert os.path.isfile(os.path.join(state, "..", "toy.pt"))  # the HF-layout export beside it
    assert sharded["cut"]["run_dir"] == sharded["resumed"]["run_dir"]


def test_a_two_rank_checkpoint_resumes_on_one_process(runs):
    """The state written by 2 ranks, resharded onto one (torch.distributed.checkpoint): the
    continued run equals the uninterrupted single-process run."""
    single, sharded = runs
    _assert_same(single["pg"], sharded["resumed_on_one"])
    assert sharded["cut_for_one"]["run_dir"] == sharded["resumed_on_one"]["run_dir"]
