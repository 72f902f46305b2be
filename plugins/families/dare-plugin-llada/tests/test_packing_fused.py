"""LLaDA through the training paths: packed == padded and fused == naive (losses, gradients)."""

import pytest
import torch

from dare_core.components.corruptions import RandomRatioMasking
from dare_core.components.estimators import MaskedTokenLogProb
from dare_core.interfaces import SequenceBatch
from dare_core.ops.paths import configure_training_paths
from dare_plugin_llada.configuration_llada import LLaDAConfig
from dare_plugin_llada.modeling_llada import LLaDAModelLM
from dare_plugin_llada.wrapper import CAPABILITIES, LLaDAWrapper

V = 128


def _wrapper(train_attention, cross_entropy, scale_logits=False, positions_seed=0, vocab=V):
    torch.manual_seed(positions_seed)
    cfg = LLaDAConfig(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        mlp_hidden_size=64,
        max_sequence_length=128,
        vocab_size=vocab,
        embedding_size=vocab,
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
        scale_logits=scale_logits,
    )
    module = LLaDAModelLM(cfg)
    w = LLaDAWrapper(
        family="llada",
        module=module,
        tokenizer=None,
        kind="masked",
        mask_token_id=V - 1,
        eos_token_id=V - 2,
        pad_token_id=V - 2,
        capabilities=CAPABILITIES,
    )
    paths = configure_training_paths(w, train_attention, cross_entropy, "cpu")
    assert paths.attention == train_attention and paths.fused_ce == (cross_entropy == "fused")
    return w


def _batch(lengths=((4, 12), (9, 3), (2, 20), (6, 7), (3, 1))):
    g = torch.Generator().manual_seed(2)
    p, r = max(a for a, _ in lengths), max(b for _, b in lengths)
    ids = torch.full((len(lengths), p + r), V - 2)
    mask = torch.zeros_like(ids)
    for i, (a, b) in enumerate(lengths):
        ids[i, p - a : p + b] = torch.randint(0, V - 3, (a + b,), generator=g)
        mask[i, p - a : p + b] = 1
    return SequenceBatch(ids, mask, p)


def _nelbo(w, batch):
    corr = RandomRatioMasking(mc_num=2)(w, batch, torch.Generator().manual_seed(0))
    logp = MaskedTokenLogProb()(w, batch, corr)
    weight = torch.where(corr.masked, 1.0 / corr.p_mask, torch.zeros(()))
    loss = (-logp * weight).sum() / corr.masked.sum()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in w.module.named_parameters()}
    return loss.detach(), logp.detach(), grads


@pytest.mark.parametrize("scale_logits", [False, True])
@pytest.mark.parametrize("cross_entropy", ["naive", "fused"])
def test_packed_equals_padded(cross_entropy, scale_logits):
    batch = _batch()
    l0, lp0, g0 = _nelbo(_wrapper("padded", "naive", scale_logits), batch)
    l1, lp1, g1 = _nelbo(_wrapper("packed", cross_entropy, scale_logits), batch)
    assert torch.allclose(l1, l0, rtol=1e-5, atol=0), (float(l1), float(l0))
    valid = batch.attention_mask.bool()[None].expand_as(lp0)
    assert torch.allclose(lp1[valid], lp0[valid], rtol=1e-5, atol=1e-5)
    for k in g0:
        assert torch.allclose(g1[k], g0[k], rtol=1e-4, atol=1e-6), k


def test_fused_equals_naive_padded_at_every_position():
    batch = _batch()
    l0, lp0, g0 = _nelbo(_wrapper("padded", "naive", True), batch)
    l1, lp1, g1 = _nelbo(_wrapper("padded", "fused", True), batch)
    assert torch.allclose(lp1, lp0, rtol=1e-5, atol=1e-6)
    assert torch.allclose(l1, l0, rtol=1e-5, atol=0)
    for k in g0:
        assert torch.allclose(g1[k], g0[k], rtol=1e-4, atol=1e-6), k


def test_restarted_positions_agree_under_rope():
    """RoPE is relative: numbering each packed document from 0 gives the padded result too."""
    from dare_core.ops.packing import plan_packing

    w = _wrapper("padded", "naive")
    batch = _batch()
    ref = w.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    plan = plan_packing(batch.attention_mask, positions="restart")
    out = w.module(
        input_ids=plan.pack(batch.input_ids, V - 2),
        attention_mask=plan.attention_mask(),
        position_ids=plan.position_ids,
    ).logits
    valid = batch.attention_mask.bool()
    assert torch.allclose(plan.unpack(out)[valid], ref[valid], atol=1e-5)
    assert plan.rows < batch.batch_size


def test_fused_path_never_builds_token_by_vocab_logits():
    """Through the wrapper (padded and packed), forward and backward: no tensor as large as
    [tokens, V]; the naive path does build one (so the check can fail)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    batch = _batch()
    tokens = int(batch.attention_mask.sum())
    big = 2048  # so that [tokens, V] dwarfs every activation of this small model
    sizes = {}
    for attention in ("padded", "packed"):
        for ce in ("naive", "fused"):
            w = _wrapper(attention, ce, vocab=big)
            w.ce_chunk_elements = 8 * big
            with Largest() as mode:
                _nelbo(w, batch)
            sizes[attention, ce] = mode.largest
    for attention in ("padded", "packed"):
        assert sizes[attention, "naive"] >= tokens * big
        # the largest fused-side tensors are weight-sized ([V, d_model] = the head and its grad)
        assert sizes[attention, "fused"] <= big * 32 < tokens * big
