"""The wrapper: registration, loading, token ids, the uniform noise kernel, and the canvas training
layout against transformers' own forward (fp32, canvas by canvas), padding and gradients."""

import json
import os

import pytest
import torch

from dare_core.api import DareError
from dare_plugin_diffusiongemma.wrapper import NO_MASK_TOKEN, load


def _rows(wrapper, prompts, canvases=3, seed=0):
    """``(clean, mask, P)``: the prompts followed by ``canvases`` canvases of ordinary tokens."""
    pid, pm = prompts
    B, P = pid.shape
    g = torch.Generator().manual_seed(seed)
    resp = torch.randint(13, wrapper.vocab_size, (B, canvases * wrapper.block_size), generator=g)
    return torch.cat([pid, resp], 1), torch.cat([pm, torch.ones_like(resp)], 1), P


def _library(module, prefix, prefix_mask, canvas):
    """transformers' forward: the encoder over ``prefix``, the decoder over one ``canvas``."""
    dec_mask = torch.cat([prefix_mask, torch.ones_like(canvas)], 1)
    return module(
        input_ids=prefix, attention_mask=prefix_mask, decoder_input_ids=canvas, decoder_attention_mask=dec_mask
    ).logits


def test_registration(registries):
    spec = registries().registries.models.get("diffusiongemma")
    assert spec.kind == "block" and spec.model_types == ("diffusion_gemma",)
    assert "uniform_noise" in spec.capabilities and not {"mask_token", "absorbing_elbo"} & spec.capabilities
    assert spec.default_rollout == "entropy_bound" and spec.rollouts == ("entropy_bound", "vllm")
    assert set(spec.config_keys) == {"text_config", "vision_config", "canvas_length"} and spec.context_key is None
    rollout = registries().registries.rollouts.get("entropy_bound")
    assert rollout.kinds == {"block"} and rollout.requires == {"uniform_noise"} and rollout.records == {"reveal_step"}


def test_token_ids_and_canvas_come_from_the_checkpoint(wrapper):
    tok = wrapper.tokenizer
    assert wrapper.block_size == wrapper.module.config.canvas_length == 4
    assert wrapper.eos_token_id == tok.convert_tokens_to_ids("<eos>") == wrapper.module.config.text_config.eos_token_id
    assert wrapper.pad_token_id == tok.convert_tokens_to_ids("<pad>")
    assert wrapper.stop_token_ids == (wrapper.eos_token_id, tok.convert_tokens_to_ids("<turn|>"))
    assert wrapper.mask_token_id == NO_MASK_TOKEN == -1
    assert (
        wrapper.render_prompt([{"role": "user", "content": "hi"}])
        == "<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    )


def test_bfloat16_loading_and_float32_logprobs(tiny_dir, prompts):
    w = load(tiny_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in w.module.parameters()} == {torch.bfloat16}
    clean, mask, P = _rows(w, prompts, canvases=1)
    lp = w.token_logprobs(clean, clean, mask, clean_ids=clean, prompt_len=P)
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all() and (lp[:, P:] < 0).all()


def test_bad_checkpoints_and_settings_are_one_line_errors(tiny_dir, tmp_path, wrapper, prompts):
    with pytest.raises(DareError, match="attn_implementation=flash_attention_2"):
        load(tiny_dir, attn_implementation="flash_attention_2")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(DareError, match="'llama'"):
        load(str(tmp_path))
    clean, mask, _ = _rows(wrapper, prompts, canvases=1)
    with pytest.raises(DareError, match="needs prompt_len") as err:
        wrapper.token_logprobs(clean, clean, mask)
    assert "\n" not in str(err.value)


def test_noise_is_uniform_over_the_vocabulary_where_asked(wrapper):
    ids = torch.full((2, 3000), 7)
    where = torch.rand(4, 2, 3000, generator=torch.Generator().manual_seed(1)) < 0.5
    out = wrapper.noise(ids, where, torch.Generator().manual_seed(2))
    assert out.shape == where.shape and (out[~where] == 7).all()
    drawn = out[where]
    assert 0 <= int(drawn.min()) and int(drawn.max()) < wrapper.vocab_size
    counts = torch.bincount(drawn, minlength=wrapper.vocab_size).float()
    expected = drawn.numel() / wrapper.vocab_size  # ~37 per id
    assert counts.min() > 0.3 * expected and counts.max() < 2.0 * expected
    torch.testing.assert_close(out, wrapper.noise(ids, where, torch.Generator().manual_seed(2)), rtol=0, atol=0)
    assert not torch.equal(out, wrapper.noise(ids, where, torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_training_forward_is_the_library_forward_canvas_by_canvas(tiny_dir, prompts, attn):
    """Canvas k of the one-pass training forward == transformers' forward with the prompt and the
    clean canvases before k encoded and canvas k decoded (left padding, sliding window exceeded)."""
    w = load(tiny_dir, attn_implementation=attn)
    clean, mask, P = _rows(w, prompts)
    assert int(mask[1].sum()) > 2 * w.sliding_window and not mask[0].all()
    C = w.block_size
    noisy = clean.clone()
    noisy[:, P:] = w.noise(
        clean[:, P:], torch.ones_like(clean[:, P:], dtype=torch.bool), torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logits = w.denoise_logits(noisy, mask, clean_ids=clean, prompt_len=P)
        assert logits.shape == (*clean.shape, w.vocab_size) and (logits[:, :P] == 0).all()
        for k in range(3):
            s = P + k * C
            ref = _library(w.module, clean[:, :s], mask[:, :s], noisy[:, s : s + C])
            torch.testing.assert_close(logits[:, s : s + C], ref, rtol=0, atol=1e-5)
        lp = w.token_logprobs(noisy, clean, mask, clean_ids=clean, prompt_len=P)
    ref_lp = torch.log_softmax(logits[:, P:], -1).gather(-1, clean[:, P:, None])[..., 0]
    torch.testing.assert_close(lp[:, P:], ref_lp, rtol=1e-5, atol=1e-5)
    assert (lp[:, :P] == 0).all()


def test_response_padding_is_invisible(wrapper, prompts):
    """A right-padded last canvas: its valid tokens get the library's logits of the shorter canvas."""
    clean, mask, P = _rows(wrapper, prompts, canvases=2)
    C = wrapper.block_size
    mask[0, P + C + 2 :] = 0
    clean[0, P + C + 2 :] = wrapper.pad_token_id
    with torch.no_grad():
        logits = wrapper.denoise_logits(clean, mask, clean_ids=clean, prompt_len=P)
        s = P + C
        ref = _library(wrapper.module, clean[:1, :s], mask[:1, :s], clean[:1, s : s + 2])
    torch.testing.assert_close(logits[:1, s : s + 2], ref, rtol=0, atol=1e-5)


def test_gradients_flow_through_the_encoder_and_the_decoder(tiny_dir, prompts):
    w = load(tiny_dir)
    clean, mask, P = _rows(w, prompts, canvases=2)
    noisy = clean.clone()
    noisy[:, P:] = w.noise(clean[:, P:], torch.rand(clean[:, P:].shape) < 0.5, torch.Generator().manual_seed(0))
    seen = {}

    def keep(name):
        def hook(_module, _inputs, output):
            output.retain_grad()
            seen[name] = output

        return hook

    w.module.model.encoder.language_model.embed_tokens.register_forward_hook(keep("encoder"))
    w.module.model.decoder.embed_tokens.register_forward_hook(keep("decoder"))
    lp = w.token_logprobs(noisy, clean, mask, clean_ids=clean, prompt_len=P)
    (-(lp * mask).sum()).backward()
    # [B, S]: the cache the decoder reads is not detached; the last canvas's clean keys are never read
    enc = seen["encoder"].grad.abs().sum(-1)
    read = mask.bool() & (torch.arange(clean.shape[1]) < P + w.block_size)
    assert (enc[read] > 0).all() and (enc[~read] == 0).all()
    assert (seen["decoder"].grad.abs().sum(-1) > 0).all()
    grads = [p.grad for p in w.module.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    # no self-conditioning signal in these likelihoods: its MLP reads zeros and gets no gradient
    sc = w.module.model.decoder.self_conditioning
    assert all(
        p.grad is None or not p.grad.any() for p in (sc.gate_proj.weight, sc.up_proj.weight, sc.down_proj.weight)
    )


def test_logits_read_the_row_as_canvases_from_column_zero(wrapper, prompts):
    clean, mask, _ = _rows(wrapper, prompts, canvases=1)
    with torch.no_grad():
        torch.testing.assert_close(
            wrapper.logits(clean, mask), wrapper.denoise_logits(clean, mask, clean_ids=clean, prompt_len=0)
        )
    assert wrapper.decoder_layers() == list(wrapper.module.model.decoder.layers)


def test_save_load_round_trip_keeps_the_generation_config(wrapper, prompts, tmp_path):
    wrapper.save_pretrained(str(tmp_path / "copy"))
    again = load(str(tmp_path / "copy"))
    clean, mask, P = _rows(wrapper, prompts, canvases=1)
    with torch.no_grad():
        torch.testing.assert_close(
            again.token_logprobs(clean, clean, mask, clean_ids=clean, prompt_len=P),
            wrapper.token_logprobs(clean, clean, mask, clean_ids=clean, prompt_len=P),
            rtol=0,
            atol=0,
        )
    gen = json.loads((tmp_path / "copy" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == list(wrapper.stop_token_ids) and gen["max_denoising_steps"] == 6
    assert again.stop_token_ids == wrapper.stop_token_ids


def test_dare_init_creates_a_tiny_checkpoint(registries, dare_cli, tmp_path):
    import dare_nn.plugin

    out = tmp_path / "init"
    res = dare_cli(registries(dare_nn.plugin))(
        "init", "--model", "diffusiongemma", "--out", str(out), "num_hidden_layers=3", "canvas_length=8", "t_min=0.3"
    )
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "diffusion_gemma" and cfg["architectures"] == ["DiffusionGemmaForBlockDiffusion"]
    assert cfg["canvas_length"] == 8 and cfg["vision_config"]["model_type"] == "gemma4_vision"
    text = cfg["text_config"]
    assert text["layer_types"] == ["sliding_attention"] * 2 + ["full_attention"]
    assert (text["num_experts"], text["top_k_experts"], text["hidden_size"]) == (4, 2, 64)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["t_min"] == 0.3 and gen["sampler_config"]["entropy_bound"] == 0.1
    w = load(str(out))
    tok = w.tokenizer
    assert [tok.convert_ids_to_tokens(i) for i in range(4)] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert os.path.getsize(out / "model.safetensors") < 2_000_000
    bad = dare_cli(registries(dare_nn.plugin))(
        "init", "--model", "diffusiongemma", "--out", str(tmp_path / "x"), "hidden_sise=3"
    )
    assert bad.exit_code == 2 and "hidden_sise" in bad.output
