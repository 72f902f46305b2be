"""Document attention kernels and the shared layers' dispatch on a DocumentMask."""

import pytest
import torch

from dare_core.api import DocumentMask
from dare_nn import layers
from dare_nn.attention import document_attention


def test_document_attention_equals_per_document_attention():
    g = torch.Generator().manual_seed(0)
    doc = torch.tensor([[0, 0, 0, 1, 1, -1], [2, 2, 2, 2, 3, 3]])
    q, k, v = (torch.randn(2, 2, 6, 4, generator=g) for _ in range(3))
    out = document_attention(q, k, v, doc)
    for r in range(2):
        for d in doc[r].unique().tolist():
            idx = (doc[r] == d).nonzero().flatten() if d >= 0 else torch.tensor([5])
            for i in idx.tolist():
                if d < 0 and i != 5:
                    continue
                s = (q[r, :, i, None, :] @ k[r][:, idx].transpose(-1, -2)) / 2.0  # [H, 1, n]
                want = (torch.softmax(s, -1) @ v[r][:, idx]).squeeze(-2)
                assert torch.allclose(out[r, :, i], want, atol=1e-6)
    with pytest.raises(ValueError, match="only on CUDA"):
        document_attention(q, k, v, doc, kernel="flex")


def test_document_mask_through_the_shared_attention_layer():
    """``layers.attend`` runs a DocumentMask's kernel; with sdpa_mask it equals the boolean mask,
    GQA included, and a mismatched mask is a clean error."""
    from dare_core.api import DocumentMask, document_mask

    g = torch.Generator().manual_seed(1)
    doc = torch.tensor([[0, 0, 1, 1, 1, -1], [2, 2, 2, 2, 2, 2]])
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(2))
    want, _ = layers.attend(q, k, v, document_mask(doc), scale=0.3, implementation=None)
    dm = layers.prepare_attention_mask(DocumentMask(doc), 2, 6, 6, 4)
    got, kv = layers.attend(q, k, v, dm, scale=0.3, implementation=None)
    assert torch.equal(got, want) and kv[0] is k
    with pytest.raises(layers.AttentionMaskError, match="DocumentMask"):
        layers.prepare_attention_mask(DocumentMask(doc), 2, 3, 6, 4)


def test_document_kernel_setup_is_built_once_per_forward():
    """The layers of one forward share the kernel's set-up through the mask's cache; a mask moved
    with ``to`` (what a module does at the start of a forward) starts empty."""
    doc = torch.tensor([[0, 0, 1, 1]])
    q = torch.randn(1, 2, 4, 8)
    mask = DocumentMask(doc)
    document_attention(q, q, q, doc, kernel="sdpa_mask", cache=mask.cache)
    built = mask.cache["bool_mask"]
    document_attention(q, q, q, doc, kernel="sdpa_mask", cache=mask.cache)
    assert mask.cache["bool_mask"] is built
    assert mask.to("cpu").cache == {}
