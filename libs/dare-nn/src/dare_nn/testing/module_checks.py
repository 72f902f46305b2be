"""Checks shared by the tests of native family modules (Hugging Face style ``PreTrainedModel``
subclasses whose ``forward(input_ids, attention_mask=None, ...)`` returns ``.logits``).

Each helper asserts one property on a model the family test builds (tiny, random, CPU):
attention-mask handling, eager/SDPA agreement, bidirectionality, bf16 behaviour, gradient
checkpointing and bit-exact save/load round trips. The family test keeps what is specific to
its architecture (hand-computed reference forwards, state-dict names, published configs).
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "random_ids",
    "assert_same_weights",
    "mask_kinds",
    "assert_padded_keys_invisible",
    "assert_eager_equals_sdpa",
    "assert_bidirectional",
    "assert_bf16_close_to_fp32",
    "assert_gradient_checkpointing_same_gradients",
    "assert_save_load_roundtrip",
    "assert_bf16_save_load_roundtrip",
    "assert_matches_reference",
    "randomize_",
]


def random_ids(vocab: int, b: int = 2, l: int = 7, seed: int = 1) -> torch.Tensor:
    """``[b, l]`` token ids uniform over ``vocab`` from a seeded generator."""
    return torch.randint(0, vocab, (b, l), generator=torch.Generator().manual_seed(seed))


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Same state-dict keys, dtypes and values (bit for bit)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def mask_kinds(b: int = 2, l: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(key, bool4, additive)``: a 2-D bool key-padding mask (row 0's last key padded), a
    random boolean ``[b, 1, l, l]`` mask with the diagonal set and one query of row 1 that sees
    nothing, and the additive (0 / -inf) twin of that boolean mask."""
    key = torch.ones(b, l, dtype=torch.bool)
    key[0, l - 1 :] = False
    bool4 = torch.rand(b, 1, l, l, generator=torch.Generator().manual_seed(0)) > 0.3
    bool4 |= torch.eye(l, dtype=torch.bool)
    bool4[1, 0, 3, :] = False  # a query that sees nothing -> zeros, like SDPA
    additive = torch.zeros(b, 1, l, l).masked_fill(~bool4, float("-inf"))
    return key, bool4, additive


def assert_padded_keys_invisible(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, vocab: int
) -> None:
    """Changing the tokens at padded positions (``mask`` 0) leaves the logits ``out`` of every
    real position unchanged (``atol`` 1e-6)."""
    padded = ~mask.bool()
    ids2 = torch.where(padded, (ids + 1) % vocab, ids)
    with torch.no_grad():
        out2 = model(ids2, attention_mask=mask).logits
    for row in range(ids.shape[0]):
        keep = ~padded[row]
        torch.testing.assert_close(out2[row, keep], out[row, keep], atol=1e-6, rtol=0)


def assert_eager_equals_sdpa(model: Any, ids: torch.Tensor, masks: Iterable[Any]) -> None:
    """For every mask the eager and SDPA attention give finite, equal logits (1e-5)."""
    for mask in masks:
        outs = []
        for impl in ("eager", "sdpa"):
            model.set_attn_implementation(impl)
            with torch.no_grad():
                outs.append(model(ids, attention_mask=mask).logits)
        assert torch.isfinite(outs[0]).all()
        torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def assert_bidirectional(model: Any, ids: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Changing the last token of row 0 changes the logits of every earlier position (no causal
    mask); returns the logits before and after the change."""
    ids2 = ids.clone()
    ids2[0, -1] = (ids2[0, -1] + 3) % vocab
    with torch.no_grad():
        a, b = model(ids).logits, model(ids2).logits
    for pos in range(ids.shape[1] - 1):
        assert (a[0, pos] - b[0, pos]).abs().max() > 1e-4
    return a, b


def assert_bf16_close_to_fp32(model: Any, ids: torch.Tensor) -> None:
    """The model cast to bf16 returns bf16 logits within 10% of the fp32 logits' largest value."""
    with torch.no_grad():
        ref = model(ids).logits
        low = model.to(torch.bfloat16)(ids).logits
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 0.1 * ref.abs().max()


def assert_gradient_checkpointing_same_gradients(
    model: Any, ids: torch.Tensor, target: torch.Tensor, layers: Optional[Sequence[Any]] = None
) -> None:
    """Cross-entropy gradients with gradient checkpointing equal those without (and every
    module of ``layers`` has checkpointing switched on)."""
    vocab = model.get_output_embeddings().weight.shape[0]

    def grads():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(ids).logits.reshape(-1, vocab), target.reshape(-1)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.train()
    plain = grads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable()
    if layers is not None:
        assert all(layer.gradient_checkpointing for layer in layers)
    ckpt = grads()
    for n in plain:
        torch.testing.assert_close(ckpt[n], plain[n], atol=1e-6, rtol=1e-5)


def assert_save_load_roundtrip(
    model: Any, ids: torch.Tensor, tmp_path: Any, autos: Sequence[Any], config_cls: type
) -> dict:
    """Save as one file and sharded (3 KB shards, with an index naming every weight), then load
    both through each of ``autos``: the native class, the same weights bit for bit and the same
    logits. Returns the sharded checkpoint's config.json."""
    from transformers import AutoConfig

    with torch.no_grad():
        ref = model(ids).logits
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="3KB")
    assert (single / "model.safetensors").exists()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert len(set(index["weight_map"].values())) > 1
    assert isinstance(AutoConfig.from_pretrained(sharded), config_cls)
    for path in (single, sharded):
        for auto in autos:
            loaded = auto.from_pretrained(path).eval()
            assert type(loaded) is type(model)
            assert_same_weights(model, loaded)
            with torch.no_grad():
                assert torch.equal(loaded(ids).logits, ref)
    return json.loads((sharded / "config.json").read_text())


def assert_bf16_save_load_roundtrip(model: Any, ids: torch.Tensor, tmp_path: Any) -> Any:
    """A bf16 model saved in 2 KB shards records ``dtype: bfloat16`` and loads back (as bf16)
    with the same weights and logits; returns the loaded model."""
    from transformers import AutoModel

    model.save_pretrained(tmp_path, max_shard_size="2KB")
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    with torch.no_grad():
        ref = model(ids).logits
    loaded = AutoModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert_same_weights(model, loaded)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, ref)
    return loaded


def assert_matches_reference(model: Any, impl: str, ids: torch.Tensor, reference: Any, vocab: int) -> torch.Tensor:
    """With attention implementation ``impl`` the logits ``[B, L, vocab]`` equal the float64
    hand computation ``reference(model, ids)`` (1e-5), whose values are non-trivial
    (``max |ref| > 0.5``); returns the reference."""
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model(ids).logits
    assert out.shape == (*ids.shape, vocab)
    ref = reference(model, ids)
    assert ref.abs().max() > 0.5
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    return ref


def randomize_(model: Any, norm_suffixes: tuple = ("norm.weight",)) -> Any:
    """Overwrite every parameter (from the global torch generator) with values large enough that
    each term of the forward matters: ``1 + 0.5 N(0, 1)`` for names ending in ``norm_suffixes``,
    ``0.5 N(0, 1)`` for biases, ``N(0, 1) / sqrt(fan_in)`` otherwise; returns the model in eval mode."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(norm_suffixes):
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return model.eval()
