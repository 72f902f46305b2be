"""LLaDA2.0 threshold and LLaDA2.1 editing samplers: hand-scripted commit orders, edits, left
padding, KV cache, stop handling, and agreement with the core ``block`` backend."""

import math

import pytest
import torch

import dare_plugin_llada2
from dare_core.workflows.batching import left_pad
from dare_plugin_llada2.sampler import (
    EditingConfig,
    EditingSampler,
    ThresholdConfig,
    ThresholdSampler,
    transfer_schedule,
)
from dare_plugin_llada2.wrapper import LLaDA2Wrapper, load
from dare_plugin_samplers.block import BlockRolloutConfig, BlockSampler

V, MASK, EOS = 32, 1, 0
A, B = 20, 21


def _logits_for(probs_and_tokens, length):
    """Logits [L, V] where position t predicts token tok with probability p (rest uniform)."""
    out = torch.zeros(length, V)
    for t, (tok, p) in probs_and_tokens.items():
        # p = e^a / (e^a + (V - 2)) with the MASK logit banned by the sampler
        out[t, tok] = math.log(p * (V - 2) / (1 - p))
    return out


class Scripted(torch.nn.Module):
    """A fake LLaDA2 module: ``rule(x_row, pos_row) -> {position: (token, prob)}``."""

    def __init__(self, rule):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.rule = rule
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        assert attention_mask is not None and attention_mask.dim() == 4
        self.calls += 1
        rows = [
            _logits_for(self.rule(input_ids[b], position_ids[b]), input_ids.shape[1]) for b in range(input_ids.shape[0])
        ]
        return type("Out", (), {"logits": torch.stack(rows)})()


def scripted_wrapper(rule, block=4):
    tok = type("Tok", (), {})()
    return LLaDA2Wrapper(
        family="llada2",
        module=Scripted(rule),
        tokenizer=tok,
        kind="block",
        mask_token_id=MASK,
        eos_token_id=EOS,
        pad_token_id=EOS,
        stop_token_ids=(EOS,),
        block_size=block,
    )


def test_schedule_matches_published_rule():
    assert transfer_schedule(32, 5) == [7, 7, 6, 6, 6]
    assert transfer_schedule(4, 6) == [1, 1, 1, 1, 0, 0]
    assert sum(transfer_schedule(32, 32)) == 32


def test_threshold_commit_order_by_hand():
    """Prompt of 3 tokens, block 4: column 3 is the first response token, block 1 = positions 4..7.
    Probabilities 4: .95, 5: .5, 6: .97, 7: .3 (threshold .9, schedule [1, 1, 1, 1]):
    step 1 commits {4, 6} (two above threshold >= quota 1), step 2 the best of the rest (5), step 3 7."""
    conf = {3: 0.99, 4: 0.95, 5: 0.5, 6: 0.97, 7: 0.3}

    def rule(x, pos):
        return {int(p): (10 + int(p), conf[int(p)]) for p in pos if int(p) in conf}

    w = scripted_wrapper(rule)
    cfg = ThresholdConfig(gen_length=5, steps=4, threshold=0.9)
    out = ThresholdSampler(cfg).generate(
        w, torch.tensor([[7, 8, 9]]), torch.ones(1, 3, dtype=torch.long), record=frozenset({"reveal_step"})
    )
    assert out.response_ids.tolist() == [[13, 14, 15, 16, 17]]
    assert out.reveal_step.tolist() == [[0, 1, 2, 1, 3]]
    assert out.nfe == 4 and out.num_steps == 4
    assert out.response_mask.tolist() == [[1, 1, 1, 1, 1]]


def test_threshold_fallback_when_fewer_than_quota_are_confident():
    """Schedule [2, 2] for block 4 over 2 steps: one position above threshold < quota 2 -> top-2."""
    conf = {0: 0.99, 1: 0.3, 2: 0.95, 3: 0.6}

    def rule(x, pos):
        return {int(p): (10 + int(p), conf[int(p)]) for p in pos if int(p) in conf}

    w = scripted_wrapper(rule)
    # a 4-token prompt fills block 0, so block 1 (positions 4..7) maps to conf via p - 4
    conf.update({4 + k: v for k, v in list(conf.items())})
    out = ThresholdSampler(ThresholdConfig(gen_length=4, steps=2, threshold=0.9)).generate(
        w, torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long), record=frozenset({"reveal_step"})
    )
    # step 0: above .9 are {4, 6} = 2 >= quota 2 -> both; step 1: {5, 7}
    assert out.reveal_step.tolist() == [[0, 1, 0, 1]]
    conf[6] = 0.5  # now only one above threshold: top-2 of {.99, .3, .5, .6} = {4, 7}
    out = ThresholdSampler(ThresholdConfig(gen_length=4, steps=2, threshold=0.9)).generate(
        w, torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long), record=frozenset({"reveal_step"})
    )
    assert out.reveal_step.tolist() == [[0, 1, 1, 0]]


def test_editing_rewrites_a_confident_changed_token_and_records_its_last_step():
    """Position 4 first predicts A (p .95); once position 5 is decoded it predicts B (p .99) and is
    re-written. Block 0 (prompt 0..2 + response 3) takes 2 iterations (commit, one post step)."""

    def rule(x, pos):
        out = {}
        for c, p in enumerate(pos.tolist()):
            if p == 3:
                out[p] = (13, 0.99)
            elif p == 4:
                col5 = c + 1
                out[p] = (A, 0.95) if int(x[col5]) == MASK else (B, 0.99)
            elif p in (5, 6, 7):
                out[p] = (10 + p, {5: 0.5, 6: 0.4, 7: 0.3}[p])
        return out

    w = scripted_wrapper(rule)
    cfg = EditingConfig(gen_length=5, threshold=0.9, editing_threshold=0.9, num_to_transfer=1)
    out = EditingSampler(cfg).generate(
        w, torch.tensor([[7, 8, 9]]), torch.ones(1, 3, dtype=torch.long), record=frozenset({"reveal_step"})
    )
    assert out.response_ids.tolist() == [[13, B, 15, 16, 17]]
    # block 1: iter 2 commits 4=A, iter 3 commits 5, iter 4 edits 4 -> B and commits 6, iter 5 commits 7,
    # iter 6 is the post step without edits
    assert out.reveal_step.tolist() == [[0, 4, 3, 4, 5]]
    assert out.nfe == 7 and out.num_steps == 7


def test_editing_stops_after_max_post_steps():
    """A token that flips every iteration is re-edited until max_post_steps runs out."""

    def rule(x, pos):
        out = {}
        for c, p in enumerate(pos.tolist()):
            if p >= 3:
                cur = int(x[c])
                out[p] = (B if cur == A else A, 0.99)
        return out

    w = scripted_wrapper(rule)
    out = EditingSampler(EditingConfig(gen_length=1, max_post_steps=3)).generate(
        w, torch.tensor([[7, 8, 9]]), torch.ones(1, 3, dtype=torch.long), record=frozenset({"reveal_step"})
    )
    # iteration 0 fills the MASK (A), then 3 post iterations each flip it: A -> B -> A -> B
    assert out.nfe == 4
    assert out.response_ids.tolist() == [[B]] and out.reveal_step.tolist() == [[3]]


def test_response_cut_after_first_stop_token():
    def rule(x, pos):
        return {int(p): ((EOS if int(p) == 5 else 10 + int(p)), 0.99) for p in pos if int(p) >= 3}

    w = scripted_wrapper(rule)
    out = ThresholdSampler(ThresholdConfig(gen_length=9, steps=4)).generate(
        w, torch.tensor([[7, 8, 9]]), torch.ones(1, 3, dtype=torch.long), record=frozenset({"reveal_step"})
    )
    assert out.response_ids.tolist() == [[13, 14, EOS, EOS, EOS, EOS, EOS, EOS, EOS]]
    assert out.response_mask.tolist() == [[1, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert out.reveal_step[0, 3:].tolist() == [-1] * 6
    assert w.module.calls == 2  # block 0 and block 1 only: the row stops after the block holding EOS


# ----------------------------------------------------------------------------- real tiny model
@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load(tiny_dir)


def _prompts(w):
    texts = ["a", "a longer prompt here 1 2 3", "hello"]
    return left_pad([w.encode(w.render_prompt([{"role": "user", "content": t}])) for t in texts], w.pad_token_id)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ThresholdSampler(ThresholdConfig(gen_length=10, steps=4, threshold=0.2)),
        lambda: EditingSampler(EditingConfig(gen_length=10, threshold=0.2, editing_threshold=0.05)),
    ],
)
def test_left_padded_batch_equals_rows_alone(tiny, make):
    pid, pm = _prompts(tiny)
    batch = make().generate(tiny, pid, pm, record=frozenset({"reveal_step"}))
    for b in range(pid.shape[0]):
        real = pid[b][pm[b].bool()][None]
        alone = make().generate(tiny, real, torch.ones_like(real), record=frozenset({"reveal_step"}))
        assert batch.response_ids[b].tolist() == alone.response_ids[0].tolist()
        assert batch.response_mask[b].tolist() == alone.response_mask[0].tolist()
    assert not (batch.response_ids == tiny.mask_token_id).any()
    assert (batch.reveal_step[batch.response_mask.bool()] >= 0).all()


@pytest.mark.parametrize(
    "cls,cfg",
    [
        (ThresholdSampler, dict(gen_length=12, steps=4, threshold=0.2)),
        (EditingSampler, dict(gen_length=12, threshold=0.2, editing_threshold=0.05)),
    ],
)
def test_kv_cache_gives_the_same_tokens(tiny, cls, cfg):
    pid, pm = _prompts(tiny)
    conf_cls = ThresholdConfig if cls is ThresholdSampler else EditingConfig
    a = cls(conf_cls(**cfg)).generate(tiny, pid, pm)
    b = cls(conf_cls(**cfg, use_cache=True)).generate(tiny, pid, pm)
    assert a.response_ids.tolist() == b.response_ids.tolist()


def test_threshold_agrees_with_core_block_backend_dynamic(tiny):
    """At T = 0 LLaDA2.0 decoding is the core backend's low_confidence_dynamic rule."""
    pid, pm = _prompts(tiny)
    for threshold in (0.05, 0.2):
        mine = ThresholdSampler(ThresholdConfig(gen_length=12, steps=4, threshold=threshold)).generate(tiny, pid, pm)
        core = BlockSampler(
            BlockRolloutConfig(
                gen_length=12,
                steps=4,
                temperature=0.0,
                remasking="low_confidence_dynamic",
                confidence_threshold=threshold,
            )
        ).generate(tiny, pid, pm)
        assert mine.response_ids.tolist() == core.response_ids.tolist()


def test_additive_01_mask_reproduces_published_21_and_differs_from_strict(tiny):
    pid, pm = _prompts(tiny)
    fr_strict = EditingSampler(EditingConfig(gen_length=8))
    fr_01 = EditingSampler(EditingConfig(gen_length=8, mask_style="additive_01"))
    a = fr_strict.generate(tiny, pid, pm)
    b = fr_01.generate(tiny, pid, pm)
    assert a.response_ids.shape == b.response_ids.shape
    # the 0/1 mask hides nothing: earlier positions see later ones, so logits differ
    from dare_plugin_llada2.sampler import _Frame

    fr = _Frame(tiny, pid, pm, 8, tiny.block_size)
    hi = fr.x.shape[1]
    m01 = fr.mask(hi, "additive_01")
    strict = fr.mask(hi, "strict")
    assert m01.dtype == torch.float32 and set(
        torch.unique(
            m01[fr.valid[:, None, :, None].expand_as(m01) & fr.valid[:, None, None, :].expand_as(m01)]
        ).tolist()
    ) <= {0.0, 1.0}
    la = tiny.module(input_ids=fr.x, attention_mask=strict, position_ids=fr.pos).logits
    lb = tiny.module(input_ids=fr.x, attention_mask=m01, position_ids=fr.pos).logits
    assert not torch.allclose(la[fr.valid], lb[fr.valid], atol=1e-4)
    with pytest.raises(ValueError):
        EditingConfig(mask_style="additive_01", use_cache=True)


def test_sampling_uses_the_generator(tiny):
    pid, pm = _prompts(tiny)
    s = ThresholdSampler(ThresholdConfig(gen_length=8, steps=4, temperature=1.0, top_k=5, top_p=0.9))
    a = s.generate(tiny, pid, pm, generator=torch.Generator().manual_seed(3))
    b = s.generate(tiny, pid, pm, generator=torch.Generator().manual_seed(3))
    assert a.response_ids.tolist() == b.response_ids.tolist()
    assert not (a.response_ids == tiny.mask_token_id).any()


def test_registered_backends(tiny):
    from dare_core.testing.registries import build_for

    dare = build_for(dare_plugin_llada2)
    fam = dare.registries.models.get("llada2")
    assert fam.kind == "block" and fam.block_size == 32 and {"llada2_threshold", "llada2_editing"} <= set(fam.rollouts)
    for name in ("llada2_threshold", "llada2_editing"):
        spec = dare.registries.rollouts.get(name)
        assert spec.kinds == frozenset({"block"}) and "reveal_step" in spec.records
