"""The ``vllm`` rollout backend on a real vLLM engine (opt-in: ``DARE_VLLM_TEST=1`` with vLLM and a
GPU; ``scripts/device/vllm_check.sh`` runs it): an engine that started from one policy and was then
given another through ``load_weights`` generates what a fresh engine started from the other
generates, for the same seeded generator.

The policies are tiny random DiffusionGemma models (2 layers, hidden 64, 4 experts top-2, canvas 8).
"""

from __future__ import annotations

import pytest
import torch

from dare_plugin_vllm.backend import VLLMRollout
from dare_plugin_vllm.checks import CheckpointPolicy, diffusion_gemma_config, random_model
from dare_plugin_vllm.config import VLLMRolloutConfig

pytestmark = pytest.mark.vllm

CANVAS, GEN = 8, 16
CONFIG = VLLMRolloutConfig(
    gen_length=GEN, gpu_memory_utilization=0.2, enforce_eager=True, max_model_len=256, max_num_seqs=8
)


def _policy(seed: int) -> CheckpointPolicy:
    model = random_model(
        diffusion_gemma_config("tiny", canvas_length=CANVAS), seed=seed, dtype=torch.bfloat16, device="cuda"
    )
    return CheckpointPolicy(model, stop_token_ids=(1,), pad_token_id=0)


def _prompts():
    rows = [[2, 40, 41, 42, 43], [2, 50], [2, 60, 61, 62, 63, 64, 65, 66], [2, 70, 71]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device="cuda")
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device="cuda")
    return ids, mask


def _generate(backend, policy):
    ids, mask = _prompts()
    return backend.generate(policy, ids, mask, generator=torch.Generator().manual_seed(11))


def test_an_engine_given_new_weights_generates_as_a_fresh_engine_of_them():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    first, second = _policy(0), _policy(1)
    synced = VLLMRollout(CONFIG)
    try:
        before = _generate(synced, first)
        again = _generate(synced, first)
        synced.load_weights(second.module.state_dict().items(), 1)
        after = _generate(synced, first)  # the engine of `first`, now holding `second`'s weights
    finally:
        synced.close()
    fresh = VLLMRollout(CONFIG)
    try:
        reference = _generate(fresh, second)
    finally:
        fresh.close()
    # the same seed reproduces a rollout; new weights change it; synced equals fresh
    assert torch.equal(before.response_ids, again.response_ids)
    assert not torch.equal(before.response_ids, reference.response_ids)
    assert torch.equal(after.response_ids, reference.response_ids)
    assert torch.equal(after.response_mask, reference.response_mask)
    lp, ref_lp = after.extras["engine_logprobs"], reference.extras["engine_logprobs"]
    assert torch.allclose(lp, ref_lp, atol=1e-3), (lp - ref_lp).abs().max()
    assert after.response_ids.shape == (4, GEN) and int(after.response_mask.sum()) > 0
