"""Helpers of the equality tests that compare an accelerated path with its reference on the same
module: grouped MoE experts against the per-expert loop, packed BD3LM rows against padded ones."""

from __future__ import annotations

from typing import Any, Callable

import torch

from dare_core.api import MaskedTokenLogProb, RandomRatioMasking, SequenceBatch
from dare_nn.block import BlockDiffusionWrapper
from dare_nn.moe import GroupedExperts


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative difference ``|a - b| / |b|`` in float64."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run_experts(module: torch.nn.Module, block_cls: type[GroupedExperts], impl: str, fn: Callable[[Any], Any]):
    """``(fn(module), {name: gradient (None as 0)})`` with every ``block_cls`` MoE block set to
    ``experts_impl = impl`` (``loop`` or ``grouped``)."""
    for m in module.modules():
        if isinstance(m, block_cls):
            m.experts_impl = impl
    module.zero_grad(set_to_none=True)
    outs = fn(module)
    return outs, {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in module.named_parameters()}


def all_grads(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])


def ragged_batch(lengths: tuple[tuple[int, int], ...], vocab: int, pad: int, seed: int = 2) -> SequenceBatch:
    """``[left-padded prompt | right-padded response]`` rows of random ids below ``vocab - 3`` with
    the (prompt, response) ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    p, r = max(a for a, _ in lengths), max(b for _, b in lengths)
    ids = torch.full((len(lengths), p + r), pad)
    mask = torch.zeros_like(ids)
    for i, (a, b) in enumerate(lengths):
        ids[i, p - a : p + b] = torch.randint(0, vocab - 3, (a + b,), generator=g)
        mask[i, p - a : p + b] = 1
    return SequenceBatch(ids, mask, p)


def nelbo_step(wrapper: Any, batch: SequenceBatch):
    """One NELBO forward/backward on two masking draws: ``(loss, per-token log-probs, {name:
    gradient}, [rows, width] the first decoder layer received per forward)``."""
    inputs = []
    wrapper.decoder_layers()[0].register_forward_pre_hook(lambda m, args: inputs.append(tuple(args[0].shape[:2])))
    corr = RandomRatioMasking(mc_num=2)(wrapper, batch, torch.Generator().manual_seed(0))
    logp = MaskedTokenLogProb()(wrapper, batch, corr)
    weight = torch.where(corr.masked, 1.0 / corr.p_mask, torch.zeros(()))
    loss = (-logp * weight).sum() / corr.masked.sum()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in wrapper.module.named_parameters() if p.grad is not None}
    return loss.detach(), logp.detach(), grads, inputs


def packed_sft_losses(
    dare: Any, family: str, wrapper_cls: type[BlockDiffusionWrapper], tmp_path: Any, monkeypatch: Any
) -> dict:
    """One-step SFT runs of the bundled ``family`` checkpoint with ``model.train_attention`` padded
    and packed: ``{attention: [loss per step]}``; checks each run took the path it names (packed
    rows forced even where packing saves no slots)."""
    import json

    from dare_core.config import resolve
    from dare_core.train import train

    monkeypatch.setattr(wrapper_cls, "packing_max_slots", 1.0)
    calls = []
    run_packed = wrapper_cls._packed_bd3lm_logprobs

    def counted(self: Any, *args: Any) -> torch.Tensor:
        calls.append(1)
        return run_packed(self, *args)

    monkeypatch.setattr(wrapper_cls, "_packed_bd3lm_logprobs", counted)
    losses = {}
    for attention in ("padded", "packed"):
        overrides = [
            "trainer.steps=1",
            "progress=false",
            f"output_dir={tmp_path}",
            "trainer.batch_size=4",
            "trainer.micro_batch_size=4",
            f"run_name={attention}",
            "eval.before=false",
            "eval.after=false",
            "trainer.save_final=false",
            f"model.train_attention={attention}",
        ]
        train(dare, resolve(dare, algo="sft", model=family, overrides=overrides))
        run = tmp_path / attention
        assert json.loads((run / "training_paths.json").read_text())["attention"] == attention
        assert bool(calls) == (attention == "packed")
        losses[attention] = [
            json.loads(line)["loss"]
            for line in (run / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)
        ]
    return losses


def assert_packed_equals_padded(padded: Any, packed: Any, batch: SequenceBatch) -> dict:
    """:func:`nelbo_step` of a padded-path and a packed-path wrapper of the same weights: packed
    rows ran (fewer, and fewer slots), log-probs equal at valid positions and 0 at padding, loss
    and every gradient equal (fp32 tolerances). Returns the padded side's gradients."""
    l0, lp0, g0, in0 = nelbo_step(padded, batch)
    l1, lp1, g1, in1 = nelbo_step(packed, batch)
    assert in1[0][0] < in0[0][0] and in1[0][0] * in1[0][1] < in0[0][0] * in0[0][1]  # packed rows ran
    valid = batch.attention_mask.bool()[None].expand_as(lp0)
    torch.testing.assert_close(lp1[valid], lp0[valid], rtol=1e-5, atol=1e-5)
    assert bool((lp1[~valid] == 0).all())
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    assert set(g1) == set(g0)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-5, msg=k)
    return g0
