"""LLaDA2-MoE: the grouped routed experts (default) equal the per-expert reference loop in outputs
and in gradients w.r.t. the input, the router and every expert weight, with the shared expert and
the group-limited, expert-bias routing unchanged; names and checkpoints unchanged."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from dare_core.api import DareError
from dare_nn.testing.equality import all_grads, rel, run_experts
from dare_plugin_llada2.configuration_llada2_moe import LLaDA2MoeConfig
from dare_plugin_llada2.hf import register_auto_classes
from dare_plugin_llada2.modeling_llada2_moe import LLaDA2MoeModelLM, LLaDA2MoeSparseMoeBlock

register_auto_classes()

REL = 1e-6


def config(**kw):
    base = dict(
        vocab_size=48,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=8,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        moe_intermediate_size=12,
        num_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        pad_token_id=0,
        eos_token_id=0,
        mask_token_id=1,
        max_position_embeddings=64,
    )
    base.update(kw)
    return LLaDA2MoeConfig(**base)


def run(module, impl, fn):
    return run_experts(module, LLaDA2MoeSparseMoeBlock, impl, fn)


@pytest.mark.parametrize(
    "experts,groups,top_groups,top_k,tokens,shared",
    [(8, 2, 1, 2, 9, 1), (4, 1, 1, 1, 1, 1), (16, 4, 2, 8, 5, 2), (32, 8, 2, 8, 3, 0), (16, 4, 4, 1, 30, 1)],
)
def test_block_grouped_equals_loop(experts, groups, top_groups, top_k, tokens, shared):
    torch.manual_seed(experts + top_k)
    block = LLaDA2MoeSparseMoeBlock(
        config(
            num_experts=experts,
            n_group=groups,
            topk_group=top_groups,
            num_experts_per_tok=top_k,
            num_shared_experts=shared,
        )
    )
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
        block.gate.expert_bias.normal_(0, 0.3)
    assert (block.shared_experts is not None) == bool(shared)
    x = torch.randn(1, tokens, 16)
    probe = torch.randn(1, tokens, 16)

    def fn(m):
        h = x.clone().requires_grad_(True)
        idx, _, _ = m.gate(h.reshape(-1, 16))
        out = m(h)
        (out * probe).sum().backward()
        return out.detach(), h.grad, idx

    (want, want_g), (got, got_g) = run(block, "loop", fn), run(block, "grouped", fn)
    assert torch.equal(got[2], want[2])  # routing untouched
    if top_groups < groups:  # group-limited: every token's experts lie in topk_group groups
        per_group = experts // groups
        assert all(len({e // per_group for e in row}) <= top_groups for row in got[2].tolist())
    for a, b in zip(got[:2], want[:2]):
        assert rel(a, b) <= REL
    assert rel(all_grads(got_g), all_grads(want_g)) <= REL
    # the router gets its gradient through the routing weights
    assert want_g["gate.weight"].abs().sum() > 0 and rel(got_g["gate.weight"], want_g["gate.weight"]) <= REL
    if shared:
        assert rel(got_g["shared_experts.up_proj.weight"], want_g["shared_experts.up_proj.weight"]) <= REL


def test_model_logits_and_gradients_equal():
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(config(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=4))
    with torch.no_grad():
        model.model.layers[1].mlp.gate.expert_bias.normal_(0, 0.5)
    ids = torch.randint(2, 48, (2, 8))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)

    def fn(m):
        logits = m(ids, attention_mask=mask).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, 48), ids.reshape(-1)).backward()
        return (logits.detach(),)

    (want, want_g), (got, got_g) = run(model, "loop", fn), run(model, "grouped", fn)
    assert rel(got[0], want[0]) <= REL and rel(all_grads(got_g), all_grads(want_g)) <= REL


def test_default_is_grouped_names_unchanged_and_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(config()).eval()
    block = model.model.layers[1].mlp
    assert block.experts_impl == "grouped" and block.grouped()
    names = [n for n, _ in model.named_parameters() if n.startswith("model.layers.1.mlp.")]
    assert names[:3] == [
        "model.layers.1.mlp.experts.0.gate_proj.weight",
        "model.layers.1.mlp.experts.0.up_proj.weight",
        "model.layers.1.mlp.experts.0.down_proj.weight",
    ]
    assert "model.layers.1.mlp.gate.expert_bias" in model.state_dict()
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).to("cpu")
    assert list(again.state_dict()) == list(model.state_dict())
    for (n, p), q in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), n
    blk = again.model.layers[1].mlp
    assert (
        blk.experts[7].up_proj.weight.untyped_storage().data_ptr()
        == blk.experts[0].gate_proj.weight.untyped_storage().data_ptr()
    )  # packed again by .to()
    ids = torch.randint(2, 48, (1, 6))
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_unknown_impl_is_an_error():
    block = LLaDA2MoeSparseMoeBlock(config())
    block.experts_impl = "vectorised"
    with pytest.raises(DareError, match="experts_impl must be one of grouped, loop"):
        block(torch.randn(1, 2, 16))
