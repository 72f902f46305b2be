"""Uniform-noise SFT (flat cross entropy, DiffusionGemma's objective) on a toy model declaring
``uniform_noise``, against hand computations."""

from __future__ import annotations

import pytest
import torch

import dare_plugin_sft
from dare_core.components import ComponentLookup, ResponseTokenLogProb
from dare_core.config.structure import structure
from dare_core.interfaces import Corrupted, SequenceBatch
from dare_core.testing import make_toy_wrapper
from dare_core.testing.registries import build_for
from dare_plugin_sft.objective import SFTConfig, make_collate
from dare_plugin_sft.uniform import UniformDiffusionCE


@pytest.fixture(scope="module")
def dare():
    return build_for(dare_plugin_sft)


@pytest.fixture(scope="module")
def components(dare):
    spec = dare.registries.algorithms.get("sft")
    cfg, problems = structure(spec.config_cls, {})
    assert not problems
    return spec.build(cfg, ComponentLookup(dare.registries, components=spec.components))


def _uniform_toy():
    """The toy model with a uniform noise kernel and the capability that declares it."""
    w = make_toy_wrapper()
    w.capabilities = frozenset({"uniform_noise"})
    vocab = w.module.vocab_size

    def noise(ids, where, generator):
        draw = torch.randint(0, vocab, torch.broadcast_shapes(ids.shape, where.shape), generator=generator)
        return torch.where(where, draw, ids)

    w.noise = noise
    return w


def _batch(w):
    return make_collate(SFTConfig(response_length=7))(
        [[10, 11, 12, 13, 14], [20, 21]], [[30, 31, 32], [40, 41, 42, 43, 44, 45]], w
    )


def test_registration(dare):
    spec = dare.registries.algorithms.get("sft")
    assert "response_token_logprob" in spec.components["estimator"]
    assert "uniform_diffusion_ce" in spec.components["loss"]
    assert dare.registries.losses.get("uniform_diffusion_ce").requires == {"uniform_noise"}


def test_flat_cross_entropy_hand_computed():
    logp = torch.tensor([[[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]]])  # [M=1, B=2, R=3]
    batch = SequenceBatch(
        torch.zeros(2, 5, dtype=torch.long), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]), prompt_len=2
    )
    masked = torch.zeros(1, 2, 5, dtype=torch.bool)
    masked[0, 0, 3] = masked[0, 1, 2] = True
    c = Corrupted(torch.zeros(1, 2, 5, dtype=torch.long), masked, masked.float(), {})
    loss, m = UniformDiffusionCE()(logp, c, batch)
    assert loss.item() == pytest.approx((1 + 2 + 3 + 0.5 + 4) / 5)  # every valid response token, no 1/t
    assert m["nll_noised"] == pytest.approx((2 + 0.5) / 2) and m["noised_tokens"] == 2


def test_uniform_noise_models_get_the_flat_objective(components):
    w = _uniform_toy()
    batch = _batch(w)
    c = components.corruption(w, batch, torch.Generator().manual_seed(0))
    assert c.extras["target_tokens"][0].tolist() == [7.0, 7.0] and "answer_len" not in c.extras
    assert not (c.noisy_ids == w.mask_token_id).any()  # the wrapper's noise, not the MASK token
    resp = c.noisy_ids[0, :, batch.prompt_len :] != batch.response_ids
    assert resp.any() and not (c.noisy_ids[0, :, : batch.prompt_len] != batch.input_ids[:, : batch.prompt_len]).any()
    logp = components.estimator(w, batch, c)
    torch.testing.assert_close(logp, ResponseTokenLogProb()(w, batch, c))
    loss, m = components.loss(logp, c, batch)
    assert loss.item() == pytest.approx(float(-logp.sum() / 14), rel=1e-6)
    # a masked model keeps the masked NELBO (target_tokens absent)
    wm = make_toy_wrapper()
    cm = components.corruption(wm, _batch(wm), torch.Generator().manual_seed(0))
    assert "target_tokens" not in cm.extras and components.estimator(wm, _batch(wm), cm).shape[-1] == 12
