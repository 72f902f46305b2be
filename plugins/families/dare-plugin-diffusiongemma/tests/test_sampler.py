"""The entropy_bound rollout backend: it is transformers' generate, deterministic given the
generator, with DARE's response window, stop mask and records."""

from types import SimpleNamespace

import pytest
import torch

from dare_core.api import structure
from dare_plugin_diffusiongemma.config import EntropyBoundConfig
from dare_plugin_diffusiongemma.sampler import DraftRecorder, EntropyBoundSampler


def test_rollout_is_transformers_generate_seeded_from_the_generator(wrapper, prompts):
    pid, pm = prompts
    P, R = pid.shape[1], 10
    backend = EntropyBoundSampler(EntropyBoundConfig(gen_length=R, t_max=0.9))
    state = torch.random.get_rng_state()
    out = backend.generate(
        wrapper, pid, pm, record=frozenset({"reveal_step"}), generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's global RNG is untouched
    again = backend.generate(wrapper, pid, pm, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out.response_ids, again.response_ids) and again.reveal_step is None
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=torch.Generator().manual_seed(3)))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        ref = wrapper.module.generate(
            input_ids=pid,
            attention_mask=pm,
            max_new_tokens=R,
            t_max=0.9,
            eos_token_id=list(wrapper.stop_token_ids),
            pad_token_id=wrapper.pad_token_id,
        )
    expected = ref.sequences[:, P : P + R]
    assert torch.equal(out.response_ids[:, : expected.shape[1]], expected)
    assert (out.response_ids[:, expected.shape[1] :] == wrapper.pad_token_id).all()
    # records: settle steps within the steps run, one encoder pass per canvas on top of them
    canvases = -(-R // wrapper.block_size)
    assert out.reveal_step.shape == (2, R) and int(out.reveal_step.min()) >= 0
    assert int(out.reveal_step.max()) < out.num_steps <= canvases * 6
    assert out.nfe == out.num_steps + canvases or (out.response_mask.sum(1) < R).all()


def test_null_settings_take_the_checkpoint_generation_config(wrapper):
    gen = EntropyBoundSampler(EntropyBoundConfig(gen_length=8)).generation_config(wrapper)
    assert (gen.max_denoising_steps, gen.t_min, gen.t_max, gen.sampler_config.entropy_bound) == (6, 0.4, 0.8, 0.1)
    assert gen.max_new_tokens == 8 and gen.eos_token_id == list(wrapper.stop_token_ids)
    gen = EntropyBoundSampler(
        EntropyBoundConfig(
            gen_length=8, max_denoising_steps=3, entropy_bound=2, stability_threshold=0, confidence_threshold=1
        )
    ).generation_config(wrapper)
    assert (
        gen.max_denoising_steps,
        gen.sampler_config.entropy_bound,
        gen.stability_threshold,
        gen.confidence_threshold,
    ) == (3, 2.0, 0, 1.0)
    assert wrapper.module.generation_config.max_denoising_steps == 6  # the model's own is not changed


def test_temperature_scales_the_schedule(wrapper, prompts):
    assert EntropyBoundSampler(EntropyBoundConfig(gen_length=4)).logits_processor() is None
    scores = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(0))
    half = EntropyBoundSampler(EntropyBoundConfig(gen_length=4, temperature=0.5)).logits_processor()
    torch.testing.assert_close(half(None, scores), scores / 0.5)
    zero = EntropyBoundSampler(EntropyBoundConfig(gen_length=4, temperature=0.0))
    probs = torch.softmax(zero.logits_processor()(None, scores), -1)
    assert torch.equal(probs.argmax(-1), scores.argmax(-1)) and (probs.max(-1).values == 1).all()
    # argmax proposals (zero entropy): each step accepts its whole canvas, iterated to a fixed point
    out = EntropyBoundSampler(EntropyBoundConfig(gen_length=8, temperature=0.0)).generate(
        wrapper, *prompts, generator=torch.Generator().manual_seed(0)
    )
    assert out.response_ids.shape == (2, 8) and (out.response_ids >= 0).all() and out.num_steps <= 2 * 6


def test_config_is_checked_and_documented():
    import attrs

    assert all(f.metadata.get("help") for f in attrs.fields(EntropyBoundConfig))
    cfg, problems = structure(EntropyBoundConfig, {"t_min": 0.8, "t_max": 0.5})
    assert cfg is None and "t_max" in problems[0]
    _, problems = structure(EntropyBoundConfig, {"gen_length": 0, "max_denoising_steps": 2.5, "entropy_bound": -1})
    assert len(problems) == 3


class _Scripted(torch.nn.Module):
    """A module whose generate streams scripted argmax drafts: canvas 0 (4 tokens) settles over
    3 steps, canvas 1 over 2; the stop id 1 ends row 0 inside canvas 1."""

    generation_config = SimpleNamespace(max_denoising_steps=4)
    drafts = [
        [
            torch.tensor([[5, 5, 5, 5], [7, 7, 7, 7]]),
            torch.tensor([[5, 6, 5, 5], [7, 7, 7, 7]]),
            torch.tensor([[5, 6, 5, 9], [7, 7, 7, 7]]),
        ],
        [torch.tensor([[8, 1, 3, 3], [2, 2, 2, 2]]), torch.tensor([[8, 1, 0, 0], [2, 4, 2, 2]])],
    ]

    def generate(self, input_ids, attention_mask, generation_config, logits_processor, streamer):
        streamer.put(input_ids)
        seq = input_ids
        for canvas in self.drafts:
            for draft in canvas:
                streamer.put_draft(value=draft)
            seq = torch.cat([seq, canvas[-1]], 1)
            streamer.put(canvas[-1])
        return SimpleNamespace(sequences=seq)


@pytest.mark.parametrize("gen_length", [6, 10])
def test_response_window_stop_mask_and_reveal_steps(gen_length):
    stub = SimpleNamespace(
        module=_Scripted(),
        capabilities=frozenset({"uniform_noise"}),
        family="stub",
        stop_token_ids=(1, 11),
        pad_token_id=0,
    )
    pid = torch.tensor([[3, 4], [0, 4]])
    out = EntropyBoundSampler(EntropyBoundConfig(gen_length=gen_length)).generate(
        stub, pid, (pid > 0).long(), record=frozenset({"reveal_step"})
    )
    full = torch.tensor([[5, 6, 5, 9, 8, 1, 0, 0, 0, 0], [7, 7, 7, 7, 2, 4, 2, 2, 0, 0]])
    settle = torch.tensor([[0, 1, 0, 2, 3, 3, 4, 4, -1, -1], [0, 0, 0, 0, 3, 4, 3, 3, -1, -1]])
    assert torch.equal(out.response_ids, full[:, :gen_length])
    assert torch.equal(out.reveal_step, settle[:, :gen_length])
    assert out.response_mask[0].tolist() == [1] * 6 + [0] * (gen_length - 6)  # through the first stop
    assert out.response_mask[1].tolist() == [1] * gen_length  # no stop: every position
    assert (out.num_steps, out.nfe) == (5, 7)


def test_draft_recorder_without_canvases():
    reveal, steps = DraftRecorder().reveal_steps(2, 3)
    assert steps == 0 and (reveal == -1).all()


def test_other_families_and_records_are_refused(toy_wrapper, wrapper, prompts):
    backend = EntropyBoundSampler(EntropyBoundConfig(gen_length=4))
    pid, pm = prompts
    with pytest.raises(ValueError, match="uniform_noise"):
        backend.generate(toy_wrapper, pid, pm)
    with pytest.raises(ValueError, match="cannot record step_states"):
        backend.generate(wrapper, pid, pm, record=frozenset({"step_states"}))
