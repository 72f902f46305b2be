"""SDAR-MoE: the grouped experts (default) equal the per-expert reference loop in outputs and in
gradients w.r.t. the input, the router and every expert weight; names and checkpoints unchanged."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from dare_core.api import DareError
from dare_nn import moe
from dare_nn.testing.equality import all_grads, rel, run_experts
from dare_plugin_sdar.configuration_sdar import SDARMoeConfig
from dare_plugin_sdar.hf import register_auto_classes
from dare_plugin_sdar.modeling_sdar_moe import SDARMoeForCausalLM, SDARMoeSparseMoeBlock

register_auto_classes()

REL = 1e-6
BASE = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rope_theta=10000.0,
    mask_token_id=96,
    eos_token_id=1,
    bos_token_id=1,
    moe_intermediate_size=24,
)


def run(module, impl, fn):
    return run_experts(module, SDARMoeSparseMoeBlock, impl, fn)


@pytest.mark.parametrize(
    "experts,top_k,tokens,norm",
    [(4, 1, 1, True), (8, 2, 9, True), (16, 8, 5, False), (32, 8, 2, True), (6, 2, 24, False)],
)
def test_block_grouped_equals_loop(experts, top_k, tokens, norm):
    torch.manual_seed(experts + top_k)
    block = SDARMoeSparseMoeBlock(
        SDARMoeConfig(**BASE, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm)
    )
    x = torch.randn(1, tokens, 32)
    probe = torch.randn(1, tokens, 32)

    def fn(m):
        h = x.clone().requires_grad_(True)
        out, logits = m(h)
        ((out * probe).sum() + logits.square().sum()).backward()
        return out.detach(), logits.detach(), h.grad

    (want, want_g), (got, got_g) = run(block, "loop", fn), run(block, "grouped", fn)
    for a, b in zip(got, want):
        assert rel(a, b) <= REL
    assert rel(all_grads(got_g), all_grads(want_g)) <= REL
    assert want_g["gate.weight"].abs().sum() > 0 and rel(got_g["gate.weight"], want_g["gate.weight"]) <= REL


def test_model_logits_and_gradients_equal():
    torch.manual_seed(0)
    model = SDARMoeForCausalLM(SDARMoeConfig(**BASE, num_experts=8, num_experts_per_tok=2))
    ids = torch.randint(2, 90, (2, 8))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)

    def fn(m):
        logits = m(ids, attention_mask=mask).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, 97), ids.reshape(-1)).backward()
        return (logits.detach(),)

    (want, want_g), (got, got_g) = run(model, "loop", fn), run(model, "grouped", fn)
    assert rel(got[0], want[0]) <= REL and rel(all_grads(got_g), all_grads(want_g)) <= REL


def test_default_is_grouped_names_unchanged_and_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = SDARMoeForCausalLM(SDARMoeConfig(**BASE, num_experts=4, num_experts_per_tok=2)).eval()
    block = model.model.layers[0].mlp
    assert block.experts_impl == "grouped" and block.grouped()
    names = [n for n, _ in model.named_parameters() if ".mlp." in n and "layers.0." in n]
    assert names[:4] == [
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.experts.0.gate_proj.weight",
        "model.layers.0.mlp.experts.0.up_proj.weight",
        "model.layers.0.mlp.experts.0.down_proj.weight",
    ]
    # built packed: each projection group of the experts is one buffer the GEMMs read as a view
    gate0 = block.experts[0].gate_proj.weight
    assert block.experts[3].up_proj.weight.untyped_storage().data_ptr() == gate0.untyped_storage().data_ptr()
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).to("cpu")
    assert list(again.state_dict()) == list(model.state_dict())
    for (n, p), q in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), n
    blk = again.model.layers[1].mlp
    assert (
        blk.experts[2].down_proj.weight.untyped_storage().data_ptr()
        == blk.experts[0].down_proj.weight.untyped_storage().data_ptr()
    )  # packed again by .to()
    ids = torch.randint(2, 90, (1, 6))
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_unknown_impl_is_an_error():
    block = SDARMoeSparseMoeBlock(SDARMoeConfig(**BASE, num_experts=4, num_experts_per_tok=2))
    block.experts_impl = "vectorised"
    with pytest.raises(DareError, match="experts_impl must be one of grouped, loop"):
        block(torch.randn(1, 2, 32))
    assert moe.IMPLS == ("grouped", "loop")
