"""The core's model-family contract on a fresh tiny DiffusionGemma from ``create``.

Two contract checks assume a MASK token and a denoiser over the whole row; for this canvas family
they are restated: there is no MASK token (``mask_token_id`` is the sentinel -1, outside the
vocabulary), and the training likelihoods need ``prompt_len`` (the canvases start at the response).
"""

import torch

import dare_plugin_diffusiongemma
import dare_plugin_samplers
import dare_plugin_tasks
from dare_core.testing.contracts import ModelFamilyContract

SIZES = dict(num_hidden_layers=2, sliding_window=8, canvas_length=4, vocab_size=300, max_denoising_steps=4)


class TestDiffusionGemmaContract(ModelFamilyContract):
    family = "diffusiongemma"
    plugins = (dare_plugin_diffusiongemma, dare_plugin_samplers, dare_plugin_tasks)
    create_kwargs = SIZES

    def test_token_ids_come_from_checkpoint(self, wrapper):
        vocab = wrapper.module.get_input_embeddings().num_embeddings
        for tid in (wrapper.eos_token_id, wrapper.pad_token_id, *wrapper.stop_token_ids):
            assert 0 <= tid < vocab
        assert wrapper.mask_token_id == -1 and "mask_token" not in wrapper.capabilities

    def test_logits_shape_and_alignment(self, wrapper):
        prompt = self._ids(wrapper)
        ids = torch.tensor([prompt + self._ids(wrapper, "the response")[-8:]])
        P = len(prompt)
        logits = wrapper.logits(ids)
        assert logits.shape[:2] == ids.shape and torch.isfinite(logits).all()
        lp = wrapper.token_logprobs(ids, ids, prompt_len=P)
        ref = torch.log_softmax(wrapper.denoise_logits(ids, prompt_len=P).float(), -1).gather(-1, ids[..., None])[
            ..., 0
        ]
        torch.testing.assert_close(lp[:, P:], ref[:, P:], rtol=1e-5, atol=1e-5)
        assert (lp[:, :P] == 0).all() and (lp <= 1e-6).all()
