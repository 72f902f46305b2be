"""Preference pairs: the UltraFeedback-style loader (parquet / jsonl, strings or message lists),
one-line errors, the save/load round trip, and pairs generated from a model's own rollouts."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dare_core.api import DareError, Example, Score
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.registries import build_for
from dare_plugin_preference import plugin
from dare_plugin_preference.pairs import (
    PreferencePair,
    generate_pairs,
    load_pairs,
    pairs_from_scores,
    save_pairs,
)


def test_ultrafeedback_parquet_with_message_lists(tmp_path):
    rows = [
        {
            "prompt": "What is 2+2?",
            "chosen": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
            "rejected": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "5"}],
            "score_chosen": 9.0,
        },
        {
            "prompt": "Say hi",
            "chosen": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
            "rejected": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "no"}],
            "score_chosen": 7.0,
        },
    ]
    path = tmp_path / "uf.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    pairs = load_pairs(str(path))
    assert [p.prompt for p in pairs] == [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Say hi"}],
    ]
    assert [(p.chosen, p.rejected) for p in pairs] == [("4", "5"), ("hi", "no")]
    assert len(load_pairs(str(path), limit=1)) == 1


def test_plain_string_jsonl_and_prompt_from_the_conversation(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps(
            {
                "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}],
                "chosen": "good",
                "rejected": "bad",
            }
        )
        + "\n\n"
        + json.dumps(
            {
                "chosen": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}],
                "rejected": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}],
            }
        )
        + "\n"
    )
    first, second = load_pairs(str(path))
    assert first.prompt == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]
    assert (first.chosen, first.rejected) == ("good", "bad")
    assert second.prompt == [{"role": "user", "content": "q2"}] and (second.chosen, second.rejected) == ("a", "b")


def test_loader_errors_are_one_line(tmp_path):
    with pytest.raises(DareError, match="preference file not found"):
        load_pairs(str(tmp_path / "missing.parquet"))
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "x", "chosen": "y"}]), bad)
    with pytest.raises(DareError, match=r"missing column\(s\) rejected"):
        load_pairs(str(bad))
    nores = tmp_path / "nores.jsonl"
    nores.write_text(json.dumps({"prompt": "x", "chosen": [{"role": "user", "content": "x"}], "rejected": "n"}) + "\n")
    with pytest.raises(DareError, match="row 0: unreadable chosen") as info:
        load_pairs(str(nores))
    assert "\n" not in str(info.value)
    (tmp_path / "x.csv").write_text("prompt,chosen,rejected\n")
    with pytest.raises(DareError, match="unsupported file type"):
        load_pairs(str(tmp_path / "x.csv"))


def test_save_and_load_round_trip(tmp_path):
    pairs = [
        PreferencePair([{"role": "user", "content": "q"}], "a", "b", {"chosen_score": 1.0}),
        PreferencePair([{"role": "user", "content": "r"}], "c", "d"),
    ]
    save_pairs(str(tmp_path / "out" / "pairs.parquet"), pairs)
    again = load_pairs(str(tmp_path / "out" / "pairs.parquet"))
    assert [(p.prompt, p.chosen, p.rejected, p.meta) for p in again] == [
        (p.prompt, p.chosen, p.rejected, p.meta) for p in pairs
    ]
    save_pairs(str(tmp_path / "empty.parquet"), [])
    assert load_pairs(str(tmp_path / "empty.parquet")) == []


def test_pairs_from_scores_best_versus_worst():
    exs = [Example([{"role": "user", "content": f"p{i}"}], "gt", "t") for i in range(3)]
    texts = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
    scores = [Score(s, float(s == 1.0)) for s in (0.5, 1.0, 0.0, 0.3, 0.3, 0.3, 0.2, 0.9, 0.4)]
    pairs = pairs_from_scores(exs, texts, scores, 3)
    assert [(p.prompt[0]["content"], p.chosen, p.rejected) for p in pairs] == [("p0", "b", "c"), ("p2", "h", "g")]
    assert pairs[0].meta["chosen_score"] == 1.0 and pairs[0].meta["rejected_score"] == 0.0
    strict = pairs_from_scores(exs, texts, scores, 3, require_correct=True)
    assert [p.prompt[0]["content"] for p in strict] == ["p0"]  # p2's best (0.9) is not fully correct


def test_generate_pairs_from_own_rollouts():
    class Digits:
        def score(self, example, response):
            frac = sum(c.isdigit() for c in response) / max(1, len(response))
            return Score(frac, float(frac == 1.0))

    dare = build_for(plugin, toy)  # the test extra brings the reference rollout backends
    spec = dare.registries.rollouts.get("low_confidence")
    from dare_core.api import structure

    cfg, problems = structure(spec.config_cls, {"gen_length": 6, "block_length": 6, "steps": 6, "temperature": 1.0})
    assert not problems
    w = make_toy_wrapper()
    exs = [Example([{"role": "user", "content": f"n{i}"}], str(i), "digits") for i in range(6)]
    pairs, stats = generate_pairs(
        w,
        spec.build(cfg),
        Digits(),
        exs,
        samples=4,
        max_prompt_length=64,
        batch_size=8,
        generator=torch.Generator().manual_seed(0),
    )
    assert pairs and stats["pairs"] == len(pairs) and 0 < stats["pair_yield"] <= 1
    task = Digits()
    for p in pairs:
        assert task.score(None, p.chosen).score > task.score(None, p.rejected).score
        assert p.meta["chosen_score"] > p.meta["rejected_score"]
    with pytest.raises(DareError, match="at least 2 samples"):
        generate_pairs(
            w, spec.build(cfg), task, exs, samples=1, max_prompt_length=64, batch_size=8, generator=torch.Generator()
        )
