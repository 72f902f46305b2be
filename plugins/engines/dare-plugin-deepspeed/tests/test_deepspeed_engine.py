"""The deepspeed engine on 2 gloo ranks (DeepSpeed's CPU accelerator) against one process.

Each check is :func:`dare_core.testing.engines.assert_same_as_single`'s — final weights within
1e-6 and the same per-step metrics as the single-process run on the same global batch — with the
single-process run shared by the tests of a module and several engine configurations trained one
after another in one pair of processes (one interpreter and DeepSpeed start-up per test; each run
joins its own process group on a fresh port).

ZeRO-3 runs use a JSON config with ``stage3_param_persistence_threshold: 0`` so that every
parameter of the toy model is partitioned (by default DeepSpeed keeps parameters under 10^5
elements whole, which is all of them).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import pytest
import torch

deepspeed = pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")

from dare_core.testing.distributed import free_port, run_ranks  # noqa: E402
from dare_core.testing.engines import TINY, max_weight_diff, same_records, train_run  # noqa: E402

PLUGIN = "dare_plugin_deepspeed.plugin"
BGPO = ("algorithm.mc_num=2", "algorithm.n_l=2", "trainer.steps=2")


def train_in_turn(
    plugins: Sequence[str], algo: str, runs: Sequence[tuple[int, list[str], bool]]
) -> list[dict[str, Any]]:
    """:func:`train_run` for each ``(port, overrides, unfinish)`` in turn in this process (rank 0's
    results; empty dicts on the others). ``unfinish``: rank 0 then removes the run's
    ``summary.json``, so the run counts as stopped after its last checkpoint (the next run's
    directory claim waits for rank 0)."""
    out = []
    for port, overrides, unfinish in runs:
        os.environ["MASTER_PORT"] = str(port)
        out.append(train_run(plugins, algo, overrides))
        if unfinish and out[-1]:
            os.remove(os.path.join(out[-1]["summary"]["run_dir"], "summary.json"))
    return out


def _common(root, *extra) -> list[str]:
    return [*TINY, f"model.path={root / 'ckpt'}", f"output_dir={root}", *extra]


def _many(plugins, algo, runs: Sequence[list[str]], unfinish: Sequence[bool] = ()) -> list[dict[str, Any]]:
    unfinish = list(unfinish) or [False] * len(runs)
    return run_ranks(2, train_in_turn, tuple(plugins), algo, [(free_port(), r, u) for r, u in zip(runs, unfinish)])[0]


def _assert_same(one: dict[str, Any], many: dict[str, Any], atol: float = 1e-6) -> None:
    diff = max_weight_diff(one["weights"], many["weights"])
    assert diff <= atol, f"weights differ by {diff:.3g} (> {atol})"
    problems = same_records(one["records"], many["records"])
    assert not problems, "\n".join(problems[:10])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepspeed")
    # every parameter partitioned under ZeRO-3; the run's values filled in where it says "auto";
    # DeepSpeed builds the optimizer from the file (torch's AdamW: the single-process update)
    (path / "zero3.json").write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": "auto",
                "bf16": {"enabled": "auto"},
                "optimizer": {
                    "type": "AdamW",
                    "params": {
                        "lr": "auto",
                        "betas": "auto",
                        "eps": "auto",
                        "weight_decay": "auto",
                        "torch_adam": True,
                    },
                },
                "zero_optimization": {
                    "stage": "auto",
                    "stage3_param_persistence_threshold": 0,
                    "stage3_model_persistence_threshold": 0,
                    "reduce_bucket_size": "auto",
                },
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def sft_single(root):
    """The single-process supervised run (fp32, the default lr 5e-7)."""
    return run_ranks(1, train_run, (PLUGIN,), "sup_test", _common(root, "run_name=one"))[0]


def _zero(root, stage: int, *extra) -> list[str]:
    ds = [f"deepspeed.config={root / 'zero3.json'}"] if stage == 3 else []
    return ["engine.name=deepspeed", f"deepspeed.zero_stage={stage}", *ds, *extra]


@pytest.fixture(scope="module")
def sft_runs(root):
    """Supervised runs on 2 ranks, one after another: ZeRO-1, 2, 3, ZeRO-3 with optimizer states
    and parameters in host memory (torch's AdamW on the CPU partitions), then bf16-mixed on
    ZeRO-2 and 3."""
    runs = {f"z{s}": _zero(root, s) for s in (1, 2, 3)}
    runs["z3-offload"] = _zero(root, 3, "deepspeed.offload_optimizer=cpu", "deepspeed.offload_param=cpu")
    runs.update({f"bf16-z{s}": _zero(root, s, "engine.precision=bf16-mixed") for s in (2, 3)})
    results = _many((PLUGIN,), "sup_test", [_common(root, *o, f"run_name={n}") for n, o in runs.items()])
    return dict(zip(runs, results))


def test_sft_on_zero_1_2_3_and_offload_equals_one_process(sft_single, sft_runs):
    assert len([r for r in sft_single["records"] if "loss" in r]) == 3
    for name in ("z1", "z2", "z3", "z3-offload"):
        assert sft_runs[name]["summary"]["world_size"] == 2
        _assert_same(sft_single, sft_runs[name])


def test_bgpo_monte_carlo_accumulation_on_zero_2_and_3_equals_one_process(root):
    """BGPO's loss runs one backward per Monte-Carlo row (several backward calls per micro-batch,
    through the engine's backward) before the step."""
    plugins = (PLUGIN, "dare_plugin_bgpo")
    one = run_ranks(1, train_run, plugins, "bgpo", _common(root, *BGPO, "run_name=bgpo-one"))[0]
    results = _many(plugins, "bgpo", [_common(root, *BGPO, *_zero(root, s), f"run_name=bgpo-z{s}") for s in (2, 3)])
    for result in results:
        _assert_same(one, result)


def test_resume_round_trips_the_deepspeed_state(root, sft_single):
    """A run checkpointed every step that stops after step 2, continued with trainer.resume=auto
    to step 3, ends like the uninterrupted run: ZeRO-2 (partitioned optimizer state) and ZeRO-3
    (partitioned parameters too), each rank restoring its own shard."""
    runs = []
    for stage in (2, 3):
        overrides = _common(root, *_zero(root, stage), f"run_name=resume-z{stage}", "trainer.save_every=1")
        runs += [[*overrides, "trainer.steps=2"], [*overrides, "trainer.resume=auto"]]
    results = _many((PLUGIN,), "sup_test", runs, unfinish=[True, False] * 2)
    for stage, stopped, resumed in zip((2, 3), results[0::2], results[1::2]):
        assert len(stopped["records"]) == 2
        state = root / f"resume-z{stage}" / "checkpoints" / "step-2" / "state" / "dare"
        assert {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= {p.name for p in state.iterdir()}
        _assert_same(sft_single, resumed)


def test_resume_on_another_world_size_is_refused(root):
    """ZeRO's state is per rank: a checkpoint of 2 ranks is refused on one process in one line."""
    from dare_core.testing.distributed import RankFailed

    overrides = _common(root, *_zero(root, 2), "run_name=other-world", "trainer.save_every=1")
    _many((PLUGIN,), "sup_test", [[*overrides, "trainer.steps=1"]], unfinish=[True])
    with pytest.raises(RankFailed, match="written by 2 processes, this run has 1; the deepspeed engine cannot"):
        run_ranks(1, train_run, (PLUGIN,), "sup_test", [*overrides, "trainer.resume=auto"])


def test_bf16_mixed_updates_reach_the_fp32_master_weights(sft_single, sft_runs):
    """At lr 5e-7 an AdamW step changes a weight by about 5e-7, far below bf16's resolution at the
    toy's weights; with DeepSpeed's bf16 (fp32 master weights) the exported weights move as in
    fp32, and the loss follows the fp32 run's."""
    from dare_core.testing.toy import make_toy_wrapper

    results = [sft_runs["bf16-z2"], sft_runs["bf16-z3"]]
    init = make_toy_wrapper().module.state_dict()
    start = torch.cat([v.flatten() for v in init.values()])
    fp32 = torch.cat([sft_single["weights"][k].flatten() for k in init]) - start
    lr = 5e-7
    moving = fp32.abs() > lr  # the weights the fp32 run moved by more than one step's worth
    assert float(moving.float().mean()) > 0.3
    for result in results:
        assert all(w.dtype == torch.float32 for w in result["weights"].values())
        final = torch.cat([result["weights"][k].flatten() for k in init])
        moved = final - start.bfloat16().float()  # DeepSpeed's masters start from the bf16 weights
        # exported fp32 masters, not bf16 values (a bf16 weight cannot hold a 5e-7 step)
        assert float((final[moving] == final[moving].bfloat16().float()).float().mean()) < 0.05
        # each of the 3 steps moved them about lr, in the fp32 run's direction
        assert float((moved[moving].abs() > 0.5 * lr).float().mean()) > 0.95
        assert float(moved.abs().max()) < 3.5 * lr
        assert float((torch.sign(moved[moving]) == torch.sign(fp32[moving])).float().mean()) > 0.95
        for a, b in zip(sft_single["records"], result["records"]):
            if "loss" in a:
                assert b["loss"] == pytest.approx(a["loss"], rel=2e-2)


def engine_steps(root: str) -> list[dict[str, Any]]:
    """On each rank, for ZeRO 1/2/3 x fp32/bf16-mixed, driving the engine as the workflows do: the
    frozen reference copy's log-likelihoods against the policy's before training, then a step
    whose loss is NaN on rank 1 only and a finite step."""
    import pathlib

    import dare_plugin_deepspeed.plugin as plugin
    from dare_core.config import resolve
    from dare_core.testing import toy
    from dare_core.testing.digits import DigitsPlugin
    from dare_core.testing.registries import build_for
    from dare_plugin_deepspeed.engine import DeepSpeedEngine

    root = pathlib.Path(root)
    dare = build_for(toy, DigitsPlugin(), plugin)
    rank = int(os.environ["RANK"])
    out = []
    ids = torch.arange(4, 16).view(2, 6)
    for stage in (1, 2, 3):
        for precision in ("fp32", "bf16-mixed"):
            cfg = resolve(
                dare,
                algo="sup_test",
                model="toy",
                overrides=[
                    *_common(root, *_zero(root, stage, f"engine.precision={precision}")),
                    "trainer.micro_batch_size=1",
                ],
            )
            engine = DeepSpeedEngine(cfg)  # joins the process group the first one started
            wrapper = toy.make_toy_wrapper()
            engine.prepare(wrapper, trainable=True)
            ref = engine.reference(wrapper)
            engine.setup_optimizer(wrapper, cfg.trainer)
            with torch.no_grad(), engine.autocast():
                ref_gap = float((ref.token_logprobs(ids, ids) - wrapper.token_logprobs(ids, ids)).abs().max())

            def weights():
                full = engine.full_state_dict(wrapper)
                return (
                    full
                    if full is not None
                    else {k: v.detach().clone() for k, v in wrapper.module.state_dict().items()}
                )

            steps = []
            for poison in (float("nan") if rank == 1 else 1.0, 1.0):
                before = weights()
                with engine.autocast():
                    logp = wrapper.token_logprobs(ids[rank : rank + 1], ids[rank : rank + 1])
                engine.backward(-logp.float().mean() * poison)
                norm, stepped = engine.step(1.0, 1e-3)
                after = weights()
                changed = any(not torch.equal(before[k], after[k]) for k in before) if rank == 0 else None
                steps.append((norm, stepped, changed, engine.optimizer.param_groups[0]["lr"]))
            out.append({"stage": stage, "precision": precision, "ref_gap": ref_gap, "steps": steps})
    engine.close()
    return out


@pytest.fixture(scope="module")
def engine_checks(root):
    return run_ranks(2, engine_steps, str(root))


def test_the_reference_copy_computes_like_the_policy(engine_checks):
    """Frozen and, under ZeRO-3, partitioned by an inference-only DeepSpeed engine; bf16-mixed:
    bf16 parameters like the policy's."""
    for rank in engine_checks:
        for case in rank:
            assert case["ref_gap"] == 0.0, case


def test_a_nonfinite_gradient_norm_skips_the_step_on_every_rank(engine_checks):
    assert [len(rank) for rank in engine_checks] == [6, 6]
    for r, rank in enumerate(engine_checks):
        for case in rank:
            (bad_norm, bad_stepped, bad_changed, _), (norm, stepped, changed, lr) = case["steps"]
            where = f"rank {r}: {case}"
            assert not math.isfinite(bad_norm) and bad_stepped is False and bad_changed in (False, None), where
            assert math.isfinite(norm) and stepped is True and changed in (True, None), where
            assert lr == 1e-3, where
    # the finite step's norm is the global one: the same on both ranks
    assert [c["steps"][1][0] for c in engine_checks[0]] == pytest.approx([c["steps"][1][0] for c in engine_checks[1]])
