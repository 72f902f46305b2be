"""Packing variable-length sequences: plan, masks and positions by hand; packed == padded."""

import pytest
import torch

from dare_core.components.corruptions import RandomRatioMasking
from dare_core.components.estimators import MaskedTokenLogProb, ResponseTokenLogProb
from dare_core.components.losses import ClippedPolicyLoss
from dare_core.interfaces import SequenceBatch
from dare_core.ops.packing import plan_packing
from dare_core.ops.paths import configure_training_paths
from dare_core.testing.toy import make_toy_wrapper


def test_plan_places_longest_first_with_hand_checked_masks_and_positions():
    # row 0: 3 valid (cols 1-3), row 1: 5 valid (cols 0-4), row 2: 1 valid (col 2)
    m = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    plan = plan_packing(m)
    assert (plan.rows, plan.width) == (2, 5)
    assert plan.doc_ids.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 2, -1]]
    assert plan.position_ids.tolist() == [[0, 1, 2, 3, 4], [1, 2, 3, 2, 0]]
    restart = plan_packing(m, positions="restart")
    assert restart.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]
    mask = plan.attention_mask()
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.bool
    assert mask[0, 0].all()
    assert mask[1, 0].int().tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1],  # filler sees only itself
    ]
    assert plan.segments().tolist() == [0, 5, 8, 9, 10]
    ids = torch.arange(15).view(3, 5)
    packed = plan.pack(ids, fill=-1)
    assert packed.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 12, -1]]
    assert plan.unpack(packed, fill=-1).tolist() == [[-1, 1, 2, 3, -1], [5, 6, 7, 8, 9], [-1, -1, 12, -1, -1]]
    assert plan.num_tokens == 9 and abs(plan.fill_ratio - 0.9) < 1e-9


def test_capacity_errors_and_empty_rows():
    m = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    plan = plan_packing(m, capacity=5)
    assert plan.rows == 1 and plan.doc_ids.tolist() == [[0, 0, 0, 2, 2]]
    with pytest.raises(ValueError, match="row capacity"):
        plan_packing(m, capacity=2)


def _toy(packed: bool, fused: bool):
    w = make_toy_wrapper(seed=3)
    w.capabilities = w.capabilities | {"packed_varlen"}
    configure_training_paths(w, "packed" if packed else "padded", "fused" if fused else "naive", "cpu")
    return w


def _batch(wrapper, lengths=((3, 5), (6, 2), (2, 9), (5, 7))):
    """Left-padded prompts, right-padded responses of the given (prompt, response) lengths."""
    g = torch.Generator().manual_seed(1)
    p = max(a for a, _ in lengths)
    r = max(b for _, b in lengths)
    ids = torch.full((len(lengths), p + r), wrapper.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, (a, b) in enumerate(lengths):
        ids[i, p - a : p + b] = torch.randint(4, 60, (a + b,), generator=g)
        mask[i, p - a : p + b] = 1
    return SequenceBatch(ids, mask, p)


def _nelbo(wrapper, batch, seed=0):
    corr = RandomRatioMasking(mc_num=2)(wrapper, batch, torch.Generator().manual_seed(seed))
    logp = MaskedTokenLogProb()(wrapper, batch, corr)
    n = corr.masked.sum()
    weight = torch.where(corr.masked, 1.0 / corr.p_mask.clamp_min(1e-12), torch.zeros(()))
    return (-logp * weight).sum() / n, logp, corr


def _grads(wrapper):
    return {k: p.grad.clone() for k, p in wrapper.module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fused", [False, True])
def test_packed_equals_padded_nelbo_and_gradients_on_toy(fused):
    ref = _toy(False, fused)
    pk = _toy(True, fused)
    batch = _batch(ref)
    l_ref, lp_ref, corr = _nelbo(ref, batch)
    l_pk, lp_pk, _ = _nelbo(pk, batch)
    assert torch.allclose(l_pk, l_ref, rtol=1e-5, atol=0)
    valid = batch.attention_mask.bool()[None].expand_as(lp_ref)
    assert torch.allclose(lp_pk[valid], lp_ref[valid], rtol=1e-5, atol=1e-6)
    assert (lp_pk[~valid] == 0).all()
    l_ref.backward()
    l_pk.backward()
    g_ref, g_pk = _grads(ref), _grads(pk)
    assert g_ref.keys() == g_pk.keys()
    for k in g_ref:
        assert torch.allclose(g_pk[k], g_ref[k], rtol=1e-4, atol=1e-6), k


def _rl_loss(wrapper, batch, old=None):
    corr = RandomRatioMasking(mc_num=1)(wrapper, batch, torch.Generator().manual_seed(5))
    logp = ResponseTokenLogProb()(wrapper, batch, corr)
    old = logp.detach() - 0.05 if old is None else old
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    loss, _ = ClippedPolicyLoss()(logp, old, None, adv, batch.response_mask)
    return loss, logp


def test_fused_equals_naive_for_nelbo_and_policy_loss_everywhere():
    """Padded layout: the fused head gives the same numbers at every position (also padding)."""
    naive, fused = _toy(False, False), _toy(False, True)
    batch = _batch(naive)
    l_n, lp_n, _ = _nelbo(naive, batch)
    l_f, lp_f, _ = _nelbo(fused, batch)
    assert torch.allclose(lp_f, lp_n, rtol=1e-5, atol=1e-6)
    assert torch.allclose(l_f, l_n, rtol=1e-5, atol=0)
    r_n, rl_n = _rl_loss(naive, batch)
    r_f, rl_f = _rl_loss(fused, batch, rl_n.detach() - 0.05)
    assert torch.allclose(rl_f, rl_n, rtol=1e-5, atol=1e-6)
    assert torch.allclose(r_f, r_n, rtol=1e-5, atol=1e-7)
    (l_n + r_n).backward()
    (l_f + r_f).backward()
    g_n, g_f = _grads(naive), _grads(fused)
    for k in g_n:
        assert torch.allclose(g_f[k], g_n[k], rtol=1e-4, atol=1e-6), k


def test_packed_policy_loss_equals_padded():
    ref, pk = _toy(False, True), _toy(True, True)
    batch = _batch(ref)
    r_ref, lp_ref = _rl_loss(ref, batch)
    r_pk, lp_pk = _rl_loss(pk, batch, lp_ref.detach() - 0.05)
    assert torch.allclose(r_pk, r_ref, rtol=1e-5, atol=1e-7)


class _ShiftedToy(type(make_toy_wrapper())):
    """A toy wrapper with an autoregressive-style alignment (aligned i = raw i - 1)."""

    logit_shift = 1

    def align(self, logits):
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


@pytest.mark.parametrize("fused", [False, True])
def test_packed_equals_padded_for_a_shifted_alignment(fused):
    ws = []
    for packed in (False, True):
        w = _toy(packed, fused)
        w.__class__ = _ShiftedToy
        assert w.supports_packing()
        ws.append(w)
    batch = _batch(ws[0])
    l_ref, lp_ref, corr = _nelbo(ws[0], batch)
    l_pk, lp_pk, _ = _nelbo(ws[1], batch)
    assert torch.allclose(l_pk, l_ref, rtol=1e-5, atol=0)
    # responses (never a row's first valid token) agree; the first token of a left-padded
    # prompt reads a pad position in the padded layout and nothing in the packed one
    resp = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    resp[:, batch.prompt_len :] = batch.response_mask.bool()
    resp = resp[None].expand_as(lp_ref)
    assert torch.allclose(lp_pk[resp], lp_ref[resp], rtol=1e-5, atol=1e-6)
    l_ref.backward()
    l_pk.backward()
    g_ref, g_pk = _grads(ws[0]), _grads(ws[1])
    for k in g_ref:
        assert torch.allclose(g_pk[k], g_ref[k], rtol=1e-4, atol=1e-6), k


class _MaskAwareShiftedToy(type(make_toy_wrapper())):
    """Shifted alignment whose sequence starts (after left padding) keep their own output."""

    logit_shift = 1

    def align(self, logits, attention_mask=None):
        out = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        if attention_mask is not None and attention_mask.dim() == 2:
            valid = attention_mask.bool()
            starts = torch.zeros_like(valid)
            starts[:, 1:] = valid[:, 1:] & ~valid[:, :-1]
            out = torch.where(starts[..., None], logits, out)
        return out

    def logits(self, input_ids, attention_mask=None):
        mask = self._padding_mask(attention_mask)
        return self.align(self._raw_logits(input_ids, mask), mask)

    def denoise_hidden(self, noisy_ids, attention_mask=None, clean_ids=None):
        mask = self._padding_mask(attention_mask)
        return self.align(self.module.forward_hidden(noisy_ids, attention_mask=mask), mask)


@pytest.mark.parametrize("fused", [False, True])
def test_packed_passes_the_padding_mask_to_a_mask_aware_alignment(fused):
    ws = []
    for packed in (False, True):
        w = _toy(packed, fused)
        w.__class__ = _MaskAwareShiftedToy
        ws.append(w)
    batch = _batch(ws[0])
    ids = batch.input_ids
    ref = ws[0].token_logprobs(ids, ids, batch.attention_mask)
    got = ws[1].token_logprobs(ids, ids, batch.attention_mask)
    valid = batch.attention_mask.bool()
    assert torch.allclose(got[valid], ref[valid], rtol=1e-5, atol=1e-6)  # prompt starts included


def test_a_batch_that_packing_would_not_shrink_runs_padded():
    w = _toy(True, False)
    seen = []
    inner = w.module.forward

    def spy(input_ids, attention_mask=None, **kw):
        seen.append(None if attention_mask is None else attention_mask.dim())
        return inner(input_ids, attention_mask=attention_mask, **kw)

    w.module.forward = spy
    little = _batch(w, lengths=((5, 9), (6, 8), (6, 9)))  # 45 slots, 43 valid
    w.token_logprobs(little.input_ids, little.input_ids, little.attention_mask)
    spread = _batch(w, lengths=((3, 5), (6, 2), (2, 9), (5, 7)))
    w.token_logprobs(spread.input_ids, spread.input_ids, spread.attention_mask)
    assert seen == [2, 4]  # key-padding mask (padded), then the document mask (packed)
