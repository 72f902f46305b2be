"""``--algo sft`` on DiffusionGemma: the uniform-noise objective through the family's canvas layout
(hand-computed from the wrapper's logits), and its loss falling on a tiny run."""

import pytest
import torch

import dare_plugin_sft
from dare_core.api import ComponentLookup, structure
from dare_plugin_diffusiongemma.wrapper import load


@pytest.fixture(scope="module")
def sft(registries):
    dare = registries(dare_plugin_sft)
    spec = dare.registries.algorithms.get("sft")
    cfg, problems = structure(spec.config_cls, {"response_length": 8})
    assert not problems
    return spec.build(cfg, ComponentLookup(dare.registries))


def _batch(sft, w):
    prompts = [w.encode(w.render_prompt([{"role": "user", "content": t}])) for t in ("add 1 2", "add 30 4 and 12")]
    responses = [w.encode("3") + [w.eos_token_id], w.encode("46, hello") + [w.eos_token_id]]
    return sft.collate(prompts, responses, w)


def test_sft_is_the_flat_cross_entropy_over_the_canvases(sft, wrapper):
    batch = _batch(sft, wrapper)
    P = batch.prompt_len
    c = sft.corruption(wrapper, batch, torch.Generator().manual_seed(0))
    assert c.extras["target_tokens"][0].tolist() == [8.0, 8.0]  # EOS padding is trained
    assert torch.equal(c.noisy_ids[0, :, :P], batch.input_ids[:, :P])
    assert (c.noisy_ids >= 0).all() and (c.noisy_ids != batch.input_ids).any()
    with torch.no_grad():
        loss, metrics = sft.loss(sft.estimator(wrapper, batch, c), c, batch)
        logits = wrapper.denoise_logits(c.noisy_ids[0], batch.attention_mask, clean_ids=batch.input_ids, prompt_len=P)
    ce = -torch.log_softmax(logits[:, P:], -1).gather(-1, batch.input_ids[:, P:, None])[..., 0]
    assert loss.item() == pytest.approx(float(ce.mean()), rel=1e-5)
    assert metrics["noised_tokens"] == float(c.masked.sum())


def test_sft_loss_falls(sft, tiny_dir):
    w = load(tiny_dir)
    batch = _batch(sft, w)
    opt = torch.optim.AdamW(w.module.parameters(), lr=3e-3)
    losses = []
    for step in range(12):
        c = sft.corruption(w, batch, torch.Generator().manual_seed(step))
        loss, _ = sft.loss(sft.estimator(w, batch, c), c, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses
