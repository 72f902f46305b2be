"""``dare compare``: two toy checkpoints on the same prompts, paired per sample (seconds)."""

from __future__ import annotations

import json

import pytest

import dare_plugin_report
import dare_plugin_samplers  # the toy family's rollout backend
from dare_core.config import resolve
from dare_core.interfaces import Score
from dare_core.plugins import build
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin, DigitsTask
from dare_core.testing.toy import make_toy_wrapper
from dare_core.workflows.evaluation import evaluate
from dare_core.workflows.runtime import eval_context

PROMPTS, SAMPLES = 6, 3


class AnyDigit(DigitsTask):
    """Solved when the response holds a digit: an untrained toy model solves some samples, so two
    checkpoints disagree on some."""

    def score(self, example, response):
        ok = float(any(c.isdigit() for c in response))
        return Score(ok, ok, response)


@pytest.fixture
def dare():
    return build(
        load_entrypoints=False,
        extra_plugins=[dare_plugin_samplers, toy, DigitsPlugin(task=AnyDigit), dare_plugin_report],
    )


@pytest.fixture
def overrides(tmp_path):
    return [
        "task.name=digits",
        f"task.num_eval={PROMPTS}",
        "rollout.gen_length=4",
        "rollout.block_length=4",
        "rollout.steps=2",
        "eval.temperature=1.0",
        "eval.batch_size=5",
        f"output_dir={tmp_path / 'out'}",
    ]


@pytest.fixture
def ckpts(tmp_path):
    paths = []
    for seed in (0, 1):
        path = tmp_path / f"toy-{seed}"
        make_toy_wrapper(seed=seed).save_pretrained(str(path))
        paths.append(str(path))
    return paths


@pytest.fixture
def run(dare, dare_cli):
    """``run(*args)``: ``dare compare ARGS`` with the registry ``dare``."""
    invoke = dare_cli(dare)
    return lambda *args: invoke("compare", *args)


def _records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _items(dare, path, overrides):
    """Per-sample accuracies of ``path``: every prompt SAMPLES times in a row, as dare eval samples."""
    cfg = resolve(dare, model="toy", overrides=["progress=false", *overrides, f"model.path={path}"], need_algo=False)
    ctx = eval_context(dare, cfg)
    examples = ctx.task.examples("eval", limit=PROMPTS, seed=cfg.seed)
    items: list[float] = []
    evaluate(ctx, [ex for ex in examples for _ in range(SAMPLES)], "check", items)
    return items


def test_two_checkpoints_paired_per_sample(dare, run, ckpts, overrides):
    a, b = ckpts
    result = run("--model", "toy", "--a", a, "--b", b, "--b", a, "--samples", str(SAMPLES), "--pool", *overrides)
    assert result.exit_code == 0, result.output
    records = _records(result.output)
    assert len(records) == 3
    ab, aa, pooled = records

    items_a, items_b = _items(dare, a, overrides), _items(dare, b, overrides)
    gained = sum(1 for x, y in zip(items_a, items_b) if y and not x)
    lost = sum(1 for x, y in zip(items_a, items_b) if x and not y)
    assert gained + lost > 0  # the two checkpoints disagree somewhere: the counts are not trivially 0
    assert (ab["samples"]["gained"], ab["samples"]["lost"]) == (gained, lost)
    assert ab["samples"]["delta"] == pytest.approx((gained - lost) / (PROMPTS * SAMPLES))
    assert ab["a"]["n"] == ab["b"]["n"] == PROMPTS * SAMPLES and ab["b_path"] == b
    assert ab["a"]["accuracy"] == pytest.approx(sum(items_a) / len(items_a))
    assert ab["b"]["accuracy"] == pytest.approx(sum(items_b) / len(items_b))
    rates_a = [sum(items_a[i : i + SAMPLES]) for i in range(0, len(items_a), SAMPLES)]
    rates_b = [sum(items_b[i : i + SAMPLES]) for i in range(0, len(items_b), SAMPLES)]
    more = sum(1 for x, y in zip(rates_a, rates_b) if y > x)
    less = sum(1 for x, y in zip(rates_a, rates_b) if y < x)
    assert (ab["prompts"]["gained"], ab["prompts"]["lost"]) == (more, less)
    assert ab["clustered"]["prompts"] == PROMPTS
    assert ab["clustered"]["delta"] == pytest.approx(ab["samples"]["delta"])

    # common random numbers: A against itself draws the same answers; A is evaluated once
    assert (aa["samples"]["gained"], aa["samples"]["lost"]) == (0, 0)
    assert aa["a"]["accuracy"] == aa["b"]["accuracy"] and aa["a"] == ab["a"]
    assert aa["clustered"]["delta"] == 0.0 and aa["clustered"]["p_value"] == 1.0

    assert pooled["pooled"] == [b, a]
    assert pooled["accuracy"] == pytest.approx((ab["b"]["accuracy"] + ab["a"]["accuracy"]) / 2)
    assert pooled["clustered"]["delta"] == pytest.approx(ab["clustered"]["delta"] / 2)

    text = result.output
    assert f"({PROMPTS} prompts x {SAMPLES} samples)" in text
    assert f"samples: vs before: +{gained} / -{lost} items" in text
    assert f"prompts solved more / less often by B: +{more} / -{less}" in text
    assert "pooled over 2 B:" in text


def test_cache_reads_back_a_repeated_evaluation(run, ckpts, overrides, tmp_path):
    a, b = ckpts
    cache = tmp_path / "cache"
    args = ["--model", "toy", "--a", a, "--b", b, "--samples", "2", "--cache", str(cache), *overrides]
    first = run(*args)
    assert first.exit_code == 0, first.output
    assert "(cached:" not in first.output and len(list(cache.glob("*.json"))) == 2
    second = run(*args)
    assert second.exit_code == 0, second.output
    assert second.output.count("(cached:") == 2
    assert _records(first.output) == _records(second.output)
    third = run(*args, "eval.temperature=0.5")  # another sampler: both evaluated anew
    assert "(cached:" not in third.output and len(list(cache.glob("*.json"))) == 4


def test_bad_input_is_one_line_before_any_evaluation(run, ckpts, overrides, tmp_path, monkeypatch):
    import dare_plugin_report.compare as compare

    def no_evaluation(*args, **kwargs):
        raise AssertionError("evaluated despite bad input")

    monkeypatch.setattr(compare, "sampled_items", no_evaluation)
    a, b = ckpts
    missing = str(tmp_path / "nope")
    line = _one_line_error(run("--model", "toy", "--a", a, "--b", b, "--b", missing, *overrides))
    assert "does not exist" in line and repr(missing) in line
    line = _one_line_error(run("--model", "toy", "--a", a, "--b", b, "--samples", "0", *overrides))
    assert "--samples must be at least 1" in line
    (tmp_path / "file").write_text("")
    line = _one_line_error(run("--model", "toy", "--a", a, "--b", b, "--cache", str(tmp_path / "file"), *overrides))
    assert "is a file" in line
    line = _one_line_error(run("--model", "toy", "--a", a, "--b", b, "--training-sampler", *overrides))
    assert "needs the run's algorithm" in line
    line = _one_line_error(run("--model", "toy", "--a", a, "--b", b, *overrides, "eval.temperature=hot"))
    assert "invalid configuration" in line


def test_training_sampler_judges_with_the_runs_rollout(run, ckpts, tmp_path):
    """``--config`` a run's config (here with its algorithm) and ``--training-sampler``: evaluation
    takes the training rollout's steps and temperature instead of eval's."""
    a, b = ckpts
    config = tmp_path / "config.yaml"
    config.write_text(
        "algo: pg_test\n"
        f"output_dir: {tmp_path / 'out'}\n"
        f"task: {{name: digits, num_eval: {PROMPTS}}}\n"
        "rollout: {gen_length: 4, block_length: 4, steps: 2, temperature: 1.0}\n"
        "eval: {steps: 4, temperature: 0.0}\n"
    )
    common = ["--model", "toy", "--a", a, "--b", b, "--samples", str(SAMPLES), "--config", str(config)]
    judged = run(*common, "--training-sampler")
    assert judged.exit_code == 0, judged.output
    by_hand = run(*common, "eval.steps=2", "eval.temperature=1.0")
    greedy = run(*common)
    assert by_hand.exit_code == 0 and greedy.exit_code == 0, by_hand.output + greedy.output
    (rec,), (same,), (other,) = (_records(r.output) for r in (judged, by_hand, greedy))
    for key in ("samples", "prompts", "clustered"):
        assert rec[key] == same[key]
    for side in ("a", "b"):
        assert (rec[side]["accuracy"], rec[side]["nfe"]) == (same[side]["accuracy"], same[side]["nfe"])
    assert other["a"]["nfe"] == 2 * rec["a"]["nfe"]  # eval.steps 4, not the rollout's 2
