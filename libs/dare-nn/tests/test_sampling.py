"""The pieces rollout backends share (``dare_nn.sampling``): checks, eval mode, micro-batches,
the response mask rule and candidate scoring."""

import subprocess
import sys
import types

import pytest
import torch

from dare_nn import sampling


def test_importing_the_module_imports_no_torch():
    code = "import sys, dare_nn.sampling; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_check_records_names_the_rollout_and_the_supported_records():
    assert sampling.check_records("the x rollout", ["a"], frozenset({"a", "b"})) == frozenset({"a"})
    with pytest.raises(KeyError, match="the x rollout cannot record c; supported records: a, b"):
        sampling.check_records("the x rollout", ["a", "c"], frozenset({"a", "b"}), error=KeyError)


def test_check_prompt_shapes_refuses_mismatched_or_flat_prompts():
    sampling.check_prompt_shapes(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"both be \[B, P\], got \(2, 3\) and \(2, 4\)"):
        sampling.check_prompt_shapes(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"got \(3,\) and \(3,\)"):
        sampling.check_prompt_shapes(torch.zeros(3), torch.ones(3))


def test_gen_length_must_be_a_multiple_of_block_length():
    sampling.check_gen_length_blocks(12, 4)
    with pytest.raises(ValueError, match=r"gen_length \(10\) must be a multiple of.*\(e\.g\. 8 or 12\)"):
        sampling.check_gen_length_blocks(10, 4)
    assert sampling.multiple_hint(3, 4) == "4"


def test_eval_mode_switches_off_training_and_grad_and_restores_each_flag():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    module[1].eval()  # a submodule already in eval mode stays so afterwards
    with sampling.eval_mode(module):
        assert not any(m.training for m in module.modules())
        assert not module(torch.ones(1, 2)).requires_grad
    assert module.training and module[0].training and not module[1].training


def test_configured_sampler_refuses_another_config_class():
    class Config:
        pass

    class Sampler(sampling.ConfiguredSampler):
        config_cls = Config

    cfg = Config()
    assert Sampler(cfg).config is cfg
    with pytest.raises(TypeError, match="Sampler needs a Config, got int"):
        Sampler(3)


def test_mask_through_first_stop():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [9, 5, 5, 5]])
    assert sampling.mask_through_first_stop(ids, [2, 9]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert sampling.mask_through_first_stop(ids, torch.tensor([7])).tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1] * 4]
    assert sampling.mask_through_first_stop(ids, [2], truncate=False).tolist() == [[1] * 4] * 3


def test_micro_batches_run_in_chunks_and_join_in_order():
    wrapper = types.SimpleNamespace(module=torch.nn.Linear(1, 1))
    ids = torch.arange(10).reshape(5, 2)
    seen = []

    def run(chunk, mask):
        seen.append(chunk.shape[0])
        assert not wrapper.module.training
        return chunk + 1, chunk * 0, 3

    parts = sampling.run_micro_batches(wrapper, ids, torch.ones_like(ids), 2, run)
    assert seen == [2, 2, 1] and wrapper.module.training
    response, reveal, nfe = sampling.join_micro_batches(parts, 2, ids.device)
    assert response.equal(ids + 1) and reveal.equal(ids * 0) and nfe == 9
    empty = sampling.join_micro_batches([], 4, ids.device)
    assert empty[0].shape == (0, 4) and empty[2] == 0


def _scoring(**options):
    cfg = dict(temperature=0.0, remasking="low_confidence", stop_confidence="keep", suppress_eos=False)
    scoring = sampling.CandidateScoring()
    scoring.config = types.SimpleNamespace(**{**cfg, **options})
    return scoring


def test_candidates_are_the_argmax_at_temperature_zero_and_a_seeded_draw_above():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    assert _scoring()._candidates(logits, None).tolist() == [1, 0]
    hot = _scoring(temperature=1.0)
    draws = [hot._candidates(logits, torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    assert draws[0].equal(draws[1])
    peaked = torch.tensor([[0.0, 50.0, 0.0]])  # a near-one-hot distribution is drawn as its mode
    assert hot._candidates(peaked, torch.Generator().manual_seed(0)).tolist() == [1]


def test_confidence_is_the_candidate_probability_and_stop_tokens_are_demoted():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    x0 = torch.tensor([1])
    stops = torch.tensor([1])
    assert _scoring()._confidence(logits, x0, None, stops).tolist() == pytest.approx([0.5])
    assert _scoring(stop_confidence="zero")._confidence(logits, x0, None, stops).tolist() == [0.0]
    assert _scoring(stop_confidence="never")._confidence(logits, x0, None, stops).tolist() == [float("-inf")]
    ban = _scoring(suppress_eos=True)._ban_mask(4, mask_id=3, eos_id=0, device="cpu")
    assert ban.tolist() == [True, False, False, True]
