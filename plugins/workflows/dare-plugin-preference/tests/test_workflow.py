"""The preference workflow on the toy family with a test-only DPO algorithm: pairs stay together
in micro-batches, the policy and the reference see the very same corruption, validation uses one
fixed corruption, and a few steps lower the held-out DPO loss."""

import json
import math

import attrs
import pytest
import torch
import torch.nn.functional as F

from dare_core.api import AlgorithmSpec, DareError, PreferenceComponents, hookimpl, option, resolve
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.registries import build_for
from dare_core.train import train
from dare_plugin_preference import plugin
from dare_plugin_preference.pairs import PreferencePair
from dare_plugin_preference.workflow import collate_pairs, pair_rows


@attrs.frozen
class PrefConfig:
    beta: float = option(1.0, "DPO beta")


class Spy:
    """Records what the estimator and the loss are called with."""

    def __init__(self):
        self.calls = []  # (grad_enabled, masked rows [M, b, S], input ids [b, S])
        self.loss_batches = []


SPY = Spy()


class _DPO:
    """DPO on the pairs of a call, divided by the step's pairs (``totals["pairs"]``)."""

    def totals(self, batch):
        return {"pairs": torch.tensor(batch.batch_size / 2, dtype=torch.float64)}

    def __call__(self, logp, ref_logp, batch, *, totals=None):
        SPY.loss_batches.append(batch.input_ids.clone())
        pol, ref = logp.mean(0), ref_logp.mean(0)
        z = (pol[0::2] - pol[1::2]) - (ref[0::2] - ref[1::2])
        pairs = (totals or self.totals(batch))["pairs"].to(z)
        loss = -F.logsigmoid(z).sum() / pairs
        return loss, {"dpo_loss": float(-F.logsigmoid(z).mean()), "reward_margin": float(z.mean().detach())}


class Plugin:
    @hookimpl
    def dare_register_algorithms(self, register):
        def build_pref(cfg, lookup):
            inner = lookup.estimator("sequence_elbo", norm="valid")

            def estimator(wrapper, batch, corrupted):
                SPY.calls.append((torch.is_grad_enabled(), corrupted.masked.clone(), batch.input_ids.clone()))
                return inner(wrapper, batch, corrupted)

            return PreferenceComponents(
                corruption=lookup.corruption("stratified_count_masking", mc_num=2, n_l=2),
                estimator=estimator,
                loss=_DPO(),
            )

        register(AlgorithmSpec("pref_test", "preference", PrefConfig, build_pref, recipe={"trainer": {"lr": 3e-3}}))


def _pairs(n):
    """Distinct prompts; chosen = digits (the preferred style), rejected = letters."""
    out = []
    for i in range(n):
        d = str(i % 10)
        out.append(PreferencePair([{"role": "user", "content": f"n{i}"}], d * 4, "ab" * (1 + i % 3)))
    return out


def _write_jsonl(path, pairs):
    with open(path, "w") as fh:
        for p in pairs:
            fh.write(
                json.dumps(
                    {
                        "prompt": p.prompt[0]["content"],
                        "chosen": p.chosen,
                        "rejected": [{"role": "user", "content": "x"}, {"role": "assistant", "content": p.rejected}],
                    }
                )
                + "\n"
            )


@pytest.fixture
def dare():
    """The workflow, the test algorithm and what the plugin's tests require (the shared ELBO
    objectives, the reference rollout backends, the default task)."""
    return build_for(plugin, toy, Plugin())


def test_the_plugin_registers_the_preference_workflow(dare):
    from dare_plugin_preference.workflow import run_preference

    assert dare.registries.workflows.get("preference").run.resolve() is run_preference
    assert dare.registries.workflows.owner("preference") == "dare_plugin_preference.plugin"


def test_collate_interleaves_pairs_and_pair_rows():
    w = make_toy_wrapper()
    pairs = _pairs(3)
    b = collate_pairs(pairs, w, max_prompt_length=64, max_response_length=16)
    assert b.batch_size == 6
    for i, p in enumerate(pairs):
        chosen = b.response_ids[2 * i][b.response_mask[2 * i].bool()].tolist()
        rejected = b.response_ids[2 * i + 1][b.response_mask[2 * i + 1].bool()].tolist()
        assert chosen == w.encode(p.chosen) + [w.eos_token_id]
        assert rejected == w.encode(p.rejected) + [w.eos_token_id]
        assert torch.equal(b.input_ids[2 * i, : b.prompt_len], b.input_ids[2 * i + 1, : b.prompt_len])
    # padding: pad id, not attended (reference layout), or trained EOS on request
    assert (b.response_ids[~b.response_mask.bool()] == w.pad_token_id).all()
    e = collate_pairs(pairs, w, max_prompt_length=64, max_response_length=16, response_length=8, pad_with_eos=True)
    assert e.response_mask.all() and e.response_ids.shape[1] == 8
    assert pair_rows(torch.tensor([0, 2])).tolist() == [0, 1, 4, 5]


def test_micro_batch_size_must_be_even(dare, tmp_path):
    _write_jsonl(tmp_path / "p.jsonl", _pairs(8))
    cfg = resolve(
        dare,
        algo="pref_test",
        model="toy",
        overrides=[
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=odd",
            "progress=false",
            f"preference.train_path={tmp_path / 'p.jsonl'}",
            "trainer.micro_batch_size=3",
            "eval.before=false",
            "eval.after=false",
            "trainer.steps=1",
        ],
    )
    with pytest.raises(Exception, match="micro_batch_size=3 must be even"):
        train(dare, cfg)


def test_pairs_together_shared_noise_and_learning(dare, tmp_path):
    SPY.calls.clear()
    SPY.loss_batches.clear()
    _write_jsonl(tmp_path / "p.jsonl", _pairs(40))
    cfg = resolve(
        dare,
        algo="pref_test",
        model="toy",
        overrides=[
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=pref",
            "progress=false",
            f"preference.train_path={tmp_path / 'p.jsonl'}",
            "preference.num_eval=8",
            "trainer.batch_size=8",
            "trainer.micro_batch_size=4",
            "trainer.steps=12",
            "eval.before=false",
            "eval.after=false",
            "seed=1",
        ],
    )
    summary = train(dare, cfg)
    before, after = summary["eval"]["pairs_before"], summary["eval"]["pairs_after"]
    assert before["dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference
    assert after["dpo_loss"] < before["dpo_loss"] - 0.05, (before, after)
    assert after["reward_margin"] > 0.1
    assert summary["train"]["train_pairs"] == 32 and summary["train"]["eval_pairs"] == 8

    # every loss call saw whole pairs: rows 2i and 2i+1 share the prompt
    for ids in SPY.loss_batches:
        assert ids.shape[0] % 2 == 0
        assert torch.equal(ids[0::2, :4], ids[1::2, :4])
    # antithetic noise: in every step the policy's rows (with grad) carry exactly the masks the
    # reference saw for the same rows just before (no grad), in the same order
    runs = []
    for grad, masked, ids in SPY.calls:
        if not runs or runs[-1][0] != grad:
            runs.append((grad, [], []))
        runs[-1][1].append(masked)
        runs[-1][2].append(ids)
    grad_runs = [i for i, r in enumerate(runs) if r[0]]
    assert len(grad_runs) == 12
    for i in grad_runs:
        pol_m, pol_ids = torch.cat(runs[i][1], 1), torch.cat(runs[i][2], 0)
        n = pol_ids.shape[0]
        assert n == 16 and all(m.shape[1] == 4 for m in runs[i][1])  # 2 pairs per micro-batch
        ref_m, ref_ids = torch.cat(runs[i - 1][1], 1)[:, -n:], torch.cat(runs[i - 1][2], 0)[-n:]
        assert torch.equal(pol_ids, ref_ids)
        assert torch.equal(pol_m, ref_m)
        assert pol_m.any()

    lines = [json.loads(l) for l in (tmp_path / "pref" / "metrics.jsonl").read_text().splitlines()]
    steps = [l for l in lines if "dpo_loss" in l]
    assert len(steps) == 12 and all("grad_norm" in l for l in steps)
    assert [l["step"] for l in lines if "eval_pairs" in l] == [0, 12]
    assert (tmp_path / "pref" / "final" / "toy.pt").exists()


def _first_step(dare, tmp_path, name, micro, extra=()):
    cfg = resolve(
        dare,
        algo="pref_test",
        model="toy",
        overrides=[
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            f"run_name={name}",
            "progress=false",
            f"preference.train_path={tmp_path / 'p.jsonl'}",
            "preference.num_eval=0",
            "trainer.batch_size=4",
            f"trainer.micro_batch_size={micro}",
            "trainer.steps=1",
            "trainer.grad_clip=0",
            "eval.before=false",
            "eval.after=false",
            "trainer.save_final=false",
            *extra,
        ],
    )
    train(dare, cfg)
    lines = [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return next(l for l in lines if "grad_norm" in l)


def test_the_step_objective_does_not_depend_on_the_micro_batch_size(dare, tmp_path):
    """The loss is normalised by the step's pairs: micro-batches of 1, 2 and 4 pairs give the same
    loss and gradient norm."""
    _write_jsonl(tmp_path / "p.jsonl", _pairs(12))
    steps = [_first_step(dare, tmp_path, f"m{m}", m) for m in (8, 4, 2)]
    assert steps[0]["grad_norm"] > 0
    for s in steps[1:]:
        assert s["grad_norm"] == pytest.approx(steps[0]["grad_norm"], rel=1e-5)
        assert s["loss"] == pytest.approx(steps[0]["loss"], rel=1e-5)


def test_a_loss_without_totals_is_refused(dare, tmp_path):
    _write_jsonl(tmp_path / "p.jsonl", _pairs(8))

    class NoTotals(Plugin):
        @hookimpl
        def dare_register_algorithms(self, register):
            def build(cfg, lookup):
                return PreferenceComponents(
                    corruption=lookup.corruption("stratified_count_masking", mc_num=2, n_l=2),
                    estimator=lookup.estimator("sequence_elbo", norm="valid"),
                    loss=lambda logp, ref_logp, batch: (logp.sum(), {}),
                )

            register(AlgorithmSpec("pref_plain", "preference", PrefConfig, build))

    d = build_for(plugin, toy, NoTotals())
    cfg = resolve(
        d,
        algo="pref_plain",
        model="toy",
        overrides=[
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=plain",
            "progress=false",
            f"preference.train_path={tmp_path / 'p.jsonl'}",
            "eval.before=false",
            "eval.after=false",
            "trainer.steps=1",
        ],
    )
    with pytest.raises(DareError, match="lacks a member of the PreferenceLoss seam"):
        train(d, cfg)


def test_validation_is_deterministic_under_the_fixed_corruption(dare, tmp_path):
    _write_jsonl(tmp_path / "p.jsonl", _pairs(12))
    outs = []
    for name in ("a", "b"):
        cfg = resolve(
            dare,
            algo="pref_test",
            model="toy",
            overrides=[
                f"model.path={tmp_path}",
                f"output_dir={tmp_path}",
                f"run_name={name}",
                "progress=false",
                f"preference.train_path={tmp_path / 'p.jsonl'}",
                "preference.num_eval=4",
                "trainer.batch_size=4",
                "trainer.micro_batch_size=8",
                "trainer.steps=1",
                "eval.before=false",
                "eval.after=false",
                "trainer.save_final=false",
                f"seed={len(outs)}",
            ],
        )
        outs.append(train(dare, cfg)["eval"]["pairs_before"])
    assert outs[0] == outs[1]  # the training seed does not change the validation corruption


def test_nonfinite_steps_in_a_row_stop_the_run(dare, tmp_path, capsys):
    """At lr 1e10 the first update destroys the toy model: the next steps' DPO loss is NaN, and
    two of them in a row stop the run before the after-validation and ``final/``."""
    _write_jsonl(tmp_path / "p.jsonl", _pairs(12))
    cfg = resolve(
        dare,
        algo="pref_test",
        model="toy",
        overrides=[
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=nan",
            "progress=false",
            f"preference.train_path={tmp_path / 'p.jsonl'}",
            "preference.num_eval=4",
            "trainer.batch_size=4",
            "trainer.micro_batch_size=8",
            "trainer.steps=6",
            "trainer.lr=1e10",
            "trainer.max_nonfinite_steps=2",
            "eval.before=false",
            "eval.after=false",
        ],
    )
    with pytest.raises(DareError, match="training diverged at step 3: non-finite loss and grad_norm for 2 steps"):
        train(dare, cfg)
    assert "step 2: non-finite loss=nan, grad_norm=nan; update skipped (1 of 2 in a row)" in capsys.readouterr().err

    def refuse(constant):
        raise ValueError(f"{constant} is not strict JSON")

    root = tmp_path / "nan"
    records = [json.loads(l, parse_constant=refuse) for l in (root / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # the validation before, then the steps
    assert [r.get("nonfinite") for r in records[2:]] == [["loss", "grad_norm", "dpo_loss", "reward_margin"]] * 2
    assert not (root / "final").exists() and not (root / "summary.json").exists()
