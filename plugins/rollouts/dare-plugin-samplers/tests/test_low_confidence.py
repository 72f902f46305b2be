"""Tests of the reference low-confidence remasking rollout backend with a tiny fake model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import dare_plugin_samplers
from dare_plugin_samplers.low_confidence import (
    LowConfidenceConfig,
    LowConfidenceSampler,
    _commit_mask,
    num_transfer_tokens,
)

VOCAB = 16
MASK = 15
EOS = 14
PAD = 13
EOT = 12  # a second stop token


class TinyBidirectional(nn.Module):
    """Deterministic bidirectional toy: every position sees the mean of all valid positions.

    Padded keys (attention mask 0) are dropped from the mean and positions are counted over
    valid tokens only, so a left-padded row behaves exactly like the same row unpadded.
    """

    def __init__(self, seed: int = 0, dim: int = 8, max_pos: int = 64, eos_bias: float = 0.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        f64 = torch.float64
        self.tok = nn.Parameter(torch.randn(VOCAB, dim, generator=g, dtype=f64))
        self.pos = nn.Parameter(torch.randn(max_pos, dim, generator=g, dtype=f64))
        self.mix = nn.Parameter(torch.randn(dim, dim, generator=g, dtype=f64))
        self.out = nn.Parameter(3.0 * torch.randn(dim, VOCAB, generator=g, dtype=f64))
        bias = torch.zeros(VOCAB, dtype=f64)
        bias[EOS] = eos_bias
        self.register_buffer("bias", bias)

    def forward(self, ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        if attention_mask is None:
            valid = torch.ones_like(ids, dtype=torch.float64)
            positions = torch.arange(ids.shape[1]).expand_as(ids)
        else:
            valid = attention_mask.to(torch.float64)
            positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        h = self.tok[ids] + self.pos[positions]
        ctx = (h * valid[..., None]).sum(dim=1, keepdim=True) / valid.sum(dim=1)[:, None, None]
        return torch.tanh(h + ctx @ self.mix) @ self.out + self.bias


class FakeWrapper:
    family = "fake"
    kind = "masked"
    capabilities = frozenset({"bidirectional"})
    tokenizer = None
    mask_token_id = MASK
    eos_token_id = EOS
    pad_token_id = PAD
    stop_token_ids = (EOS, EOT)
    block_size = None

    def __init__(self, **kwargs):
        self.module = TinyBidirectional(**kwargs)
        self.calls: list[dict] = []

    def logits(self, input_ids, attention_mask=None):
        self.calls.append(
            {
                "ids": input_ids.clone(),
                "mask": None if attention_mask is None else attention_mask.clone(),
                "grad": torch.is_grad_enabled(),
                "training": self.module.training,
            }
        )
        return self.module(input_ids, attention_mask)


def _prompts(lengths=(5, 3, 5, 2), width=5, seed=7):
    """Left-padded prompts with tokens in [0, 12)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(0, 12, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids, mask


def _run(cfg_kwargs, wrapper=None, lengths=(5, 3, 5, 2), seed=None, record=("reveal_step",)):
    wrapper = wrapper or FakeWrapper()
    ids, mask = _prompts(lengths)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    out = LowConfidenceSampler(LowConfidenceConfig(**cfg_kwargs)).generate(
        wrapper, ids, mask, record=frozenset(record), generator=gen
    )
    return out, wrapper


def _state_before(out, step: int) -> torch.Tensor:
    """The sequence the model saw at global step ``step`` (reconstructed from reveal_step)."""
    masks = torch.full_like(out.response_ids, MASK)
    resp = torch.where(out.reveal_step < step, out.response_ids, masks)
    return torch.cat([out.prompt_ids, resp], dim=1)


def _model_logits(wrapper, out, step):
    attn = None
    if not bool(out.prompt_mask.bool().all()):
        attn = torch.cat([out.prompt_mask, torch.ones_like(out.response_ids)], dim=1)
    with torch.no_grad():
        logits = wrapper.module(_state_before(out, step), attn)[:, out.prompt_ids.shape[1] :]
    return logits.float().masked_fill(torch.arange(VOCAB) == MASK, -math.inf)


# --------------------------------------------------------------------------- schedule
def test_schedule_oracles():
    assert num_transfer_tokens(torch.tensor([32]), 5).tolist() == [[7, 7, 6, 6, 6]]
    assert num_transfer_tokens(torch.tensor([32]), 16).tolist() == [[2] * 16]
    assert num_transfer_tokens(torch.tensor([3]), 5).tolist() == [[1, 1, 1, 0, 0]]
    q = num_transfer_tokens(torch.tensor([32, 3, 0, 5]), 5)
    assert q.shape == (4, 5) and q.dtype == torch.long
    assert q.sum(dim=1).tolist() == [32, 3, 0, 5]


def test_commit_mask_handles_excess_quota_and_minus_inf():
    conf = torch.tensor([[0.9, -math.inf, 0.5, 0.7], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    eligible = torch.tensor([[False, True, True, False], [True, True, True, True]])
    # quota above the eligible count commits every eligible position and nothing else
    got = _commit_mask(conf, eligible, torch.tensor([5, 0]))
    assert got.tolist() == [[False, True, True, False], [False] * 4]
    # -inf is ranked last among eligible positions but before ineligible ones
    got = _commit_mask(conf, eligible, torch.tensor([1, 2]))
    assert got.tolist() == [[False, False, True, False], [False, False, True, True]]


# --------------------------------------------------------------------------- greedy structure
@pytest.mark.parametrize("gen_length,block_length,steps", [(16, 4, 8), (16, 8, 6), (8, 8, 3)])
def test_greedy_follows_schedule_inside_the_current_block(gen_length, block_length, steps):
    out, wrapper = _run(dict(gen_length=gen_length, block_length=block_length, steps=steps, temperature=0.0))
    b = out.response_ids.shape[0]
    spb = steps // (gen_length // block_length)
    rs = out.reveal_step
    assert rs.shape == (b, gen_length) and rs.dtype == torch.long
    assert out.num_steps == steps
    # every response position committed exactly once, at a step in [0, steps)
    assert bool(((rs >= 0) & (rs < steps)).all())
    assert not bool((out.response_ids == MASK).any())
    expected = num_transfer_tokens(torch.full((b,), block_length), spb)
    for step in range(steps):
        blk, local = divmod(step, spb)
        committed = rs == step
        assert committed.sum(dim=1).tolist() == expected[:, local].tolist()
        cols = committed.nonzero()[:, 1]
        assert bool(((cols >= blk * block_length) & (cols < (blk + 1) * block_length)).all())
    assert out.nfe == len(wrapper.calls) == steps


def test_greedy_commits_the_argmax_of_the_most_confident_positions():
    out, wrapper = _run(dict(gen_length=16, block_length=8, steps=8, temperature=0.0))
    block, spb = 8, 4
    for step in range(8):
        logits = _model_logits(wrapper, out, step)
        x0 = logits.argmax(dim=-1)
        conf = torch.softmax(logits, dim=-1).gather(-1, x0[..., None]).squeeze(-1)
        committed = out.reveal_step == step
        assert bool((out.response_ids[committed] == x0[committed]).all())
        blk = step // spb
        in_block = torch.zeros_like(committed)
        in_block[:, blk * block : (blk + 1) * block] = True
        waiting = in_block & (out.reveal_step > step)
        for row in range(committed.shape[0]):
            if committed[row].any() and waiting[row].any():
                assert conf[row][committed[row]].min() >= conf[row][waiting[row]].max()


def test_steps_beyond_block_masks_are_skipped():
    out, wrapper = _run(dict(gen_length=8, block_length=4, steps=16, temperature=0.0))
    # 4 masks over 8 steps per block: [1, 1, 1, 1, 0, 0, 0, 0]; empty steps run no forward
    assert out.nfe == len(wrapper.calls) == 8
    for blk in range(2):
        steps = sorted(out.reveal_step[0, blk * 4 : (blk + 1) * 4].tolist())
        assert steps == [blk * 8 + s for s in range(4)]


# --------------------------------------------------------------------------- randomness
@pytest.mark.parametrize("kwargs", [dict(temperature=1.0), dict(temperature=0.0, remasking="random")])
def test_sampling_is_reproducible_per_seed(kwargs):
    cfg = dict(gen_length=16, block_length=8, steps=8, **kwargs)
    a, _ = _run(cfg, seed=1)
    b, _ = _run(cfg, seed=1)
    c, _ = _run(cfg, seed=2)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.reveal_step, b.reveal_step)
    assert not (torch.equal(a.response_ids, c.response_ids) and torch.equal(a.reveal_step, c.reveal_step))
    greedy, _ = _run(dict(gen_length=16, block_length=8, steps=8, temperature=0.0))
    assert not (torch.equal(a.response_ids, greedy.response_ids) and torch.equal(a.reveal_step, greedy.reveal_step))


# --------------------------------------------------------------------------- guidance, eos
def test_cfg_doubles_nfe_and_masks_only_valid_prompt_tokens():
    cfg = dict(gen_length=8, block_length=4, steps=4, temperature=0.0)
    plain, _ = _run(cfg)
    guided, wrapper = _run(dict(cfg, cfg_scale=1.5))
    assert plain.nfe == 4 and guided.nfe == 8
    first = wrapper.calls[0]
    b, p = plain.prompt_ids.shape
    assert first["ids"].shape == (2 * b, p + 8)
    assert torch.equal(first["ids"][:b, :p], plain.prompt_ids)
    uncond = first["ids"][b:, :p]
    valid = plain.prompt_mask.bool()
    assert bool((uncond[valid] == MASK).all())
    assert torch.equal(uncond[~valid], plain.prompt_ids[~valid])
    assert torch.equal(first["mask"][:b], first["mask"][b:])


def test_suppress_eos_never_commits_eos():
    cfg = dict(gen_length=16, block_length=8, steps=16, temperature=1.0)
    biased = lambda: FakeWrapper(eos_bias=4.0)  # noqa: E731
    free, _ = _run(cfg, wrapper=biased(), seed=3)
    assert bool((free.response_ids == EOS).any())  # the test model does like EOS
    out, _ = _run(dict(cfg, suppress_eos=True), wrapper=biased(), seed=3)
    assert not bool((out.response_ids == EOS).any())
    assert bool((out.reveal_step >= 0).all())


@pytest.mark.parametrize("rule", ["zero", "never"])
def test_stop_confidence_commits_stop_tokens_last(rule):
    cfg = dict(gen_length=16, block_length=8, steps=8, temperature=0.0, stop_confidence=rule)
    out, wrapper = _run(cfg, wrapper=FakeWrapper(eos_bias=2.0))
    assert bool((out.reveal_step >= 0).all())  # "never" still completes every block
    stops = torch.tensor([EOS, EOT])
    seen_stop = False
    for step in range(8):
        logits = _model_logits(wrapper, out, step)
        x0 = logits.argmax(dim=-1)
        blk = step // 4
        in_block = torch.zeros_like(out.reveal_step, dtype=torch.bool)
        in_block[:, blk * 8 : (blk + 1) * 8] = True
        waiting = in_block & (out.reveal_step > step)
        committed = out.reveal_step == step
        for row in range(x0.shape[0]):
            if bool(torch.isin(out.response_ids[row][committed[row]], stops).any()):
                seen_stop = True
                # a stop candidate was committed: no waiting position had a non-stop candidate
                assert bool(torch.isin(x0[row][waiting[row]], stops).all())
    assert seen_stop


# --------------------------------------------------------------------------- padding, chunks
def test_attention_mask_passed_only_with_padding():
    _, wrapper = _run(dict(gen_length=8, block_length=8, steps=2, temperature=0.0), lengths=(5, 5))
    assert all(call["mask"] is None for call in wrapper.calls)
    _, wrapper = _run(dict(gen_length=8, block_length=8, steps=2, temperature=0.0), lengths=(5, 2))
    masks = [call["mask"] for call in wrapper.calls]
    assert all(m is not None for m in masks)
    assert masks[0][1].tolist() == [0, 0, 0] + [1] * 10
    assert masks[0][0].tolist() == [1] * 13


def test_left_padded_row_equals_unpadded_prompt():
    cfg = LowConfidenceConfig(gen_length=16, block_length=8, steps=8, temperature=0.0)
    ids, mask = _prompts((5, 3))
    wrapper = FakeWrapper()
    record = frozenset({"reveal_step"})
    batch = LowConfidenceSampler(cfg).generate(wrapper, ids, mask, record=record)
    alone = LowConfidenceSampler(cfg).generate(wrapper, ids[1:, 2:], mask[1:, 2:], record=record)
    assert wrapper.calls[-1]["mask"] is None
    assert torch.equal(batch.response_ids[1], alone.response_ids[0])
    assert torch.equal(batch.reveal_step[1], alone.reveal_step[0])


def test_micro_batches_match_one_batch_when_greedy():
    cfg = dict(gen_length=16, block_length=8, steps=8, temperature=0.0)
    whole, w1 = _run(cfg, lengths=(5, 3, 5, 2, 4))
    chunked, w2 = _run(dict(cfg, micro_batch_size=2), lengths=(5, 3, 5, 2, 4))
    assert torch.equal(whole.response_ids, chunked.response_ids)
    assert torch.equal(whole.reveal_step, chunked.reveal_step)
    assert max(c["ids"].shape[0] for c in w2.calls) == 2
    assert chunked.nfe == len(w2.calls) == 3 * whole.nfe


# --------------------------------------------------------------------------- masks, modes, errors
def test_truncate_at_eos_response_mask():
    sampler = LowConfidenceSampler(LowConfidenceConfig(gen_length=4, block_length=4, steps=4, truncate_at_eos=True))
    resp = torch.tensor([[1, EOS, 2, EOS], [1, 2, 3, 4], [EOS, 1, 1, 1]])
    assert sampler._response_mask(resp, EOS).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    cfg = dict(gen_length=16, block_length=8, steps=16, temperature=1.0)
    full, _ = _run(cfg, wrapper=FakeWrapper(eos_bias=4.0), seed=3, record=())
    assert full.reveal_step is None
    assert full.response_mask.dtype == torch.long and bool((full.response_mask == 1).all())
    cut, _ = _run(dict(cfg, truncate_at_eos=True), wrapper=FakeWrapper(eos_bias=4.0), seed=3)
    assert torch.equal(cut.response_ids, full.response_ids)
    for row in range(cut.response_ids.shape[0]):
        hits = (cut.response_ids[row] == EOS).nonzero()
        n = int(hits[0]) + 1 if len(hits) else 16
        assert cut.response_mask[row].tolist() == [1] * n + [0] * (16 - n)


def test_module_mode_restored_and_no_grad():
    wrapper = FakeWrapper()
    wrapper.module.train()
    _run(dict(gen_length=8, block_length=8, steps=2), wrapper=wrapper, seed=0)
    assert wrapper.module.training
    assert all(not c["training"] and not c["grad"] for c in wrapper.calls)
    wrapper.module.eval()
    _run(dict(gen_length=8, block_length=8, steps=2), wrapper=wrapper, seed=0)
    assert not wrapper.module.training


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(gen_length=100, block_length=32), ["gen_length", "block_length", "96 or 128"]),
        (dict(gen_length=64, block_length=16, steps=10), ["steps", "multiple of 4", "8 or 12"]),
        (dict(gen_length=0), ["gen_length", "> 0"]),
        (dict(block_length=True), ["block_length"]),
        (dict(temperature=-0.1), ["temperature", ">= 0"]),
        (dict(cfg_scale=float("nan")), ["cfg_scale"]),
        (dict(remasking="entropy"), ["remasking", "low_confidence", "random"]),
        (dict(stop_confidence="drop"), ["stop_confidence", "keep", "zero", "never"]),
        (dict(micro_batch_size=-1), ["micro_batch_size"]),
    ],
)
def test_invalid_configs_raise_helpful_errors(kwargs, words):
    with pytest.raises(ValueError) as info:
        LowConfidenceConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_config_fields_have_help_and_defaults():
    cfg = LowConfidenceConfig()
    assert (cfg.gen_length, cfg.block_length, cfg.steps, cfg.temperature) == (256, 32, 128, 0.6)
    for field in LowConfidenceConfig.__attrs_attrs__:
        assert field.metadata.get("help")


def test_unknown_record_and_wrong_kind_raise():
    with pytest.raises(ValueError, match="reveal_step"):
        _run(dict(gen_length=8, block_length=8, steps=2), record=("states",))
    wrapper = FakeWrapper()
    wrapper.kind = "block"
    with pytest.raises(ValueError, match="masked"):
        _run(dict(gen_length=8, block_length=8, steps=2), wrapper=wrapper)


def test_registered_as_a_rollout_backend():
    from dare_core.plugins import build

    dare = build(load_entrypoints=False, default_plugins=False, extra_plugins=[dare_plugin_samplers])
    spec = dare.registries.rollouts.get("low_confidence")
    assert spec.config_cls is LowConfidenceConfig
    assert spec.kinds == frozenset({"masked"}) and "reveal_step" in spec.records
    assert isinstance(spec.build(LowConfidenceConfig()), LowConfidenceSampler)
