"""The ``vllm`` rollout backend without vLLM: registration, config, the install error, the prompt
and output conversions, seeding, the engine start (export, engine arguments) and the weight push.

``RecordingLLM`` below is a test double of ``vllm.LLM`` (it lives only here): it records every call
and answers ``generate`` with tokens drawn from torch's global random stream — the stream the real
engine's sampler draws from — so the backend's reseeding shows in its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import dare_plugin_vllm
from dare_core.api import CapabilityError, DareError, RolloutBatch, structure
from dare_core.testing.registries import build_for
from dare_plugin_vllm import backend as vb
from dare_plugin_vllm.backend import VLLMRollout
from dare_plugin_vllm.checks import CheckpointPolicy, diffusion_gemma_config, random_model
from dare_plugin_vllm.config import VLLMRolloutConfig

STOP, PAD = 1, 0


class RecordingLLM:
    """Test double of ``vllm.LLM`` (see the module docstring)."""

    def __init__(self, vocab: int = 12):
        self.vocab, self.calls, self.reloaded = vocab, [], []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        kwargs = kwargs or {}
        if callable(method):  # vLLM calls it with the worker first
            self.calls.append(("rpc", method.__name__, args))
            return [method(self, *args, **kwargs)]
        self.calls.append(("rpc", method, dict(kwargs)))
        if method == "reload_weights":  # the model's loader consumes the pairs
            self.handed = list(kwargs["weights_iterator"])
            self.reloaded.append([(name, t.clone()) for name, t in self.handed])
        return [None]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append(("generate", prompts, params))
        outs = []
        for _ in prompts:
            ids = torch.randint(1, self.vocab, (params["max_tokens"],)).tolist()
            stop = next((j for j, t in enumerate(ids) if t in params["stop_token_ids"]), None)
            ids = ids if stop is None else ids[: stop + 1]  # the engine ends a request at a stop token
            lps = None
            if params["logprobs"] is not None:
                lps = [{t: SimpleNamespace(logprob=-0.1 * t)} for t in ids]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=lps)]))
        return outs


class Starts:
    """``start`` for :class:`VLLMRollout`: a :class:`RecordingLLM` per engine start, recording the
    engine arguments and the export the engine would read."""

    def __init__(self):
        self.kwargs, self.llms, self.exports = [], [], []

    def __call__(self, kwargs):
        path = kwargs["model"]
        with open(os.path.join(path, "generation_config.json")) as fh:
            gen = json.load(fh)
        self.exports.append((sorted(os.listdir(path)), gen, load_file(os.path.join(path, "model.safetensors"))))
        self.kwargs.append(kwargs)
        self.llms.append(RecordingLLM())
        return self.llms[-1], dict


@pytest.fixture(scope="module")
def policy():
    return CheckpointPolicy(
        random_model(diffusion_gemma_config("tiny", canvas_length=8), seed=0), stop_token_ids=(STOP,), pad_token_id=PAD
    )


def _prompts():
    rows = [[5, 6, 7], [8], [9, 10, 11, 12]]
    width = max(map(len, rows))
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask, rows


# ---------------------------------------------------------------- registration, config, install
def test_registered_as_a_synced_block_backend_needing_uniform_noise():
    spec = build_for(dare_plugin_vllm).registries.rollouts.get("vllm")
    assert spec.sync == "state"
    assert spec.kinds == frozenset({"block"}) and spec.requires == frozenset({"uniform_noise"})
    assert spec.records == frozenset() and spec.config_cls is VLLMRolloutConfig


def test_registering_imports_neither_torch_nor_vllm():
    code = (
        "import sys, dare_plugin_vllm, dare_plugin_vllm.config; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_config_fields_have_help_and_bad_values_are_all_reported():
    import attrs

    assert all(f.metadata.get("help") for f in attrs.fields(VLLMRolloutConfig))
    cfg, problems = structure(VLLMRolloutConfig, {"gen_length": 64, "dtype": "bfloat16"}, "rollout")
    assert not problems and cfg.gen_length == 64 and cfg.dtype == "bfloat16"
    bad = {
        "gen_length": 0,
        "gpu_memory_utilization": 1.5,
        "dtype": "int8",
        "tensor_parallel_size": 0,
        "max_num_seqs": -1,
        "temperature": 0.5,
    }
    cfg, problems = structure(VLLMRolloutConfig, bad, "rollout")
    assert cfg is None
    text = " | ".join(problems)
    for key in bad:
        assert f"rollout.{key}" in text, (key, text)


def test_missing_vllm_is_one_line_naming_the_extra_before_any_work(monkeypatch):
    real = vb.importlib.util.find_spec
    monkeypatch.setattr(vb.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    spec = build_for(dare_plugin_vllm).registries.rollouts.get("vllm")
    with pytest.raises(DareError) as err:
        spec.build(VLLMRolloutConfig())
    message = str(err.value)
    assert "pip install 'dare-plugin-vllm[vllm]'" in message and "\n" not in message


def test_process_checks(monkeypatch):
    monkeypatch.setenv(vb.MULTIPROCESSING, "1")
    with pytest.raises(DareError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1"):
        VLLMRollout(VLLMRolloutConfig(), start=Starts())
    monkeypatch.setenv(vb.MULTIPROCESSING, "0")
    with pytest.raises(DareError, match="rollout.export_dir=/no/such/dir is not a directory"):
        VLLMRollout(VLLMRolloutConfig(export_dir="/no/such/dir"), start=Starts())
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DareError, match="tensor_parallel_size=2 under torchrun"):
        VLLMRollout(VLLMRolloutConfig(tensor_parallel_size=2), start=Starts())
    VLLMRollout(VLLMRolloutConfig(), start=Starts())  # one GPU per rank is fine
    kw = vb.engine_kwargs(VLLMRolloutConfig(), "/ckpt", 8)
    assert kw["distributed_executor_backend"] == "external_launcher"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert "distributed_executor_backend" not in vb.engine_kwargs(VLLMRolloutConfig(), "/ckpt", 8)


# ---------------------------------------------------------------- conversions
def test_prompt_lists_strip_the_left_padding():
    ids, mask, rows = _prompts()
    assert vb.prompt_lists(ids, mask) == rows
    with pytest.raises(DareError, match="prompt row 1 has no token"):
        vb.prompt_lists(ids, torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(DareError, match=r"\[B, P\]"):
        vb.prompt_lists(ids, mask[:, :2])


def test_outputs_become_a_right_padded_batch_masked_through_the_first_stop():
    ids, mask, _ = _prompts()
    rows = [
        ([4, 5, STOP], [-0.5, -0.25, -0.125]),  # stopped: mask through the stop token
        ([4, 5, 6, 7, 8, 9], [-1.0] * 6),  # longer than gen_length: cut, all counted
        ([7, 8], None),
    ]  # ended early without a stop: its length
    out = vb.to_rollout_batch(ids, mask, rows, 5, (STOP, 99), PAD, with_logprobs=True)
    assert isinstance(out, RolloutBatch) and out.prompt_ids is ids and out.prompt_mask is mask
    assert out.response_ids.tolist() == [[4, 5, STOP, PAD, PAD], [4, 5, 6, 7, 8], [7, 8, PAD, PAD, PAD]]
    assert out.response_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert out.response_mask.dtype == torch.long and out.response_ids.dtype == torch.long
    assert out.extras["engine_logprobs"].tolist() == [[-0.5, -0.25, -0.125, 0, 0], [-1.0] * 5, [0.0] * 5]
    # tokens after a stop (an engine that ran on) are padding, outside the mask
    late = vb.to_rollout_batch(ids[:1], mask[:1], [([STOP, 4, 5], None)], 4, (STOP,), PAD, with_logprobs=False)
    assert late.response_ids.tolist() == [[STOP, PAD, PAD, PAD]] and late.response_mask.tolist() == [[1, 0, 0, 0]]
    assert late.extras == {}
    with pytest.raises(DareError, match="2 responses for 3 prompts"):
        vb.to_rollout_batch(ids, mask, rows[:2], 5, (STOP,), PAD, with_logprobs=False)


def test_output_rows_read_each_tokens_own_logprob():
    lp = SimpleNamespace
    outs = [
        SimpleNamespace(
            outputs=[
                SimpleNamespace(
                    token_ids=(4, 5, 6),
                    logprobs=[{4: lp(logprob=-0.5), 9: lp(logprob=-2.0)}, {5: lp(logprob=-0.25)}, None],
                )
            ]
        ),
        SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7], logprobs=None)]),
        SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7, 8], logprobs=[{7: lp(logprob=-1.0)}])]),
    ]
    rows = vb.output_rows(outs)
    assert rows[0][0] == [4, 5, 6] and rows[0][1][:2] == [-0.5, -0.25] and rows[0][1][2] != rows[0][1][2]
    assert rows[1] == ([7], None)
    assert rows[2][0] == [7, 8] and rows[2][1][0] == -1.0 and len(rows[2][1]) == 2  # one entry per token


def test_sampling_and_engine_arguments():
    cfg = VLLMRolloutConfig(
        gen_length=32,
        logprobs=False,
        max_denoising_steps=12,
        max_num_seqs=4,
        attention_backend="TRITON_ATTN",
        dtype="bfloat16",
    )
    assert vb.sampling_kwargs(cfg, (1, 106)) == dict(
        max_tokens=32, stop_token_ids=[1, 106], ignore_eos=True, logprobs=None, detokenize=False
    )
    assert vb.sampling_kwargs(VLLMRolloutConfig(), ())["logprobs"] == 0
    kw = vb.engine_kwargs(cfg, "/ckpt", 16)
    assert kw["diffusion_config"] == {"canvas_length": 16, "max_denoising_steps": 12}
    assert (kw["model"], kw["dtype"], kw["max_num_seqs"], kw["attention_backend"]) == (
        "/ckpt",
        "bfloat16",
        4,
        "TRITON_ATTN",
    )
    assert kw["language_model_only"] and kw["skip_tokenizer_init"] and "max_model_len" not in kw
    assert vb.engine_kwargs(VLLMRolloutConfig(), "/c", 8)["diffusion_config"] == {"canvas_length": 8}


def test_draw_seed_follows_the_generator():
    a = [vb.draw_seed(torch.Generator().manual_seed(3)) for _ in range(2)]
    g = torch.Generator().manual_seed(3)
    b = [vb.draw_seed(g), vb.draw_seed(g)]
    assert a[0] == a[1] == b[0] and b[1] != b[0] and all(0 <= s < 2**31 - 1 for s in b)


def test_generation_config_gets_the_sampler_settings_vllm_reads(tmp_path):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    (tmp_path / "generation_config.json").write_text(json.dumps({"t_min": 0.3, "t_max": None, "eos_token_id": 1}))
    filled = vb.complete_generation_config(str(tmp_path))
    data = json.loads((tmp_path / "generation_config.json").read_text())
    defaults = DiffusionGemmaGenerationConfig._get_default_generation_params()
    assert "t_min" not in filled and data["t_min"] == 0.3 and data["eos_token_id"] == 1
    assert set(filled) == set(vb.SAMPLER_KEYS) - {"t_min"}
    assert data["t_max"] == defaults["t_max"] and data["stability_threshold"] == defaults["stability_threshold"]
    assert data["sampler_config"] == {
        "entropy_bound": defaults["sampler_config"].entropy_bound,
        "_cls_name": "EntropyBoundSamplerConfig",
    }
    empty = tmp_path / "none"
    empty.mkdir()
    assert set(vb.complete_generation_config(str(empty))) == set(vb.SAMPLER_KEYS)


# ---------------------------------------------------------------- the backend over the test double
def test_first_generate_starts_the_engine_from_an_export_of_the_policy(policy, tmp_path):
    starts = Starts()
    backend = VLLMRollout(
        VLLMRolloutConfig(gen_length=6, gpu_memory_utilization=0.5, export_dir=str(tmp_path)), start=starts
    )
    ids, mask, rows = _prompts()
    path = None
    try:
        out = backend.generate(policy, ids, mask, generator=torch.Generator().manual_seed(0))
        backend.generate(policy, ids, mask, generator=torch.Generator().manual_seed(1))
        assert len(starts.kwargs) == 1  # started once
        kw = starts.kwargs[0]
        path = kw["model"]
        assert os.path.dirname(path) == str(tmp_path)
        assert kw["diffusion_config"] == {"canvas_length": 8} and kw["gpu_memory_utilization"] == 0.5
        files, gen, weights = starts.exports[0]
        assert {"config.json", "generation_config.json", "model.safetensors"} <= set(files)
        assert all(gen[k] is not None for k in vb.SAMPLER_KEYS)
        own = policy.module.state_dict()
        assert weights and all(torch.equal(weights[k], own[k]) for k in weights)
        llm = starts.llms[0]
        generates = [c for c in llm.calls if c[0] == "generate"]
        assert generates[0][1] == [{"prompt_token_ids": r} for r in rows]
        assert generates[0][2] == dict(
            max_tokens=6, stop_token_ids=[STOP], ignore_eos=True, logprobs=0, detokenize=False
        )
        assert out.response_ids.shape == (3, 6) and out.extras["engine_logprobs"].shape == (3, 6)
        for r in range(3):  # the mask runs through the first stop token (or the whole response)
            row = out.response_ids[r].tolist()
            n = row.index(STOP) + 1 if STOP in row else 6
            assert out.response_mask[r].tolist() == [1] * n + [0] * (6 - n)
            assert row[n:] == [PAD] * (6 - n)
    finally:
        backend.close()
    assert path is not None and not os.path.exists(path)  # the export goes with the engine


def test_a_seeded_generator_reproduces_the_rollout_and_leaves_the_trainers_stream(policy):
    ids, mask, _ = _prompts()

    def run(seed, reseed=True):
        backend = VLLMRollout(VLLMRolloutConfig(gen_length=8, reseed=reseed), start=Starts())
        try:
            return backend.generate(policy, ids, mask, generator=torch.Generator().manual_seed(seed))
        finally:
            backend.close()

    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b, c = run(5), run(5), run(6)
    assert torch.equal(torch.get_rng_state(), state)  # the engine's reseeding ran in a fork
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert not torch.equal(a.response_ids, c.response_ids)
    starts = Starts()
    backend = VLLMRollout(VLLMRolloutConfig(reseed=False), start=starts)
    backend.generate(policy, ids, mask, generator=torch.Generator().manual_seed(5))
    assert not [c for c in starts.llms[0].calls if c[:2] == ("rpc", "reseed_worker")]
    backend.close()


def test_backends_of_one_policy_share_an_engine(policy):
    starts = Starts()
    train = VLLMRollout(VLLMRolloutConfig(gen_length=4), start=starts)
    evaluation = VLLMRollout(VLLMRolloutConfig(gen_length=8, logprobs=False), start=starts)  # per-call fields differ
    other = VLLMRollout(VLLMRolloutConfig(gen_length=4, max_num_seqs=2), start=starts)  # an engine setting differs
    ids, mask, _ = _prompts()
    try:
        for backend in (train, evaluation, other):
            backend.generate(policy, ids, mask)
        assert len(starts.kwargs) == 2 and train.engine(policy) is evaluation.engine(policy)
        assert "engine_logprobs" not in evaluation.generate(policy, ids, mask).extras
    finally:
        train.close()
        other.close()
    evaluation.generate(policy, ids, mask)  # the closed engine is started again
    assert len(starts.kwargs) == 3
    evaluation.close()


def test_records_are_refused(policy):
    ids, mask, _ = _prompts()
    with pytest.raises(CapabilityError, match="cannot record reveal_step"):
        VLLMRollout(VLLMRolloutConfig(), start=Starts()).generate(policy, ids, mask, record=frozenset({"reveal_step"}))


def test_a_model_without_a_canvas_is_refused():
    wrapper = SimpleNamespace(family="llada", module=torch.nn.Linear(2, 2))
    with pytest.raises(CapabilityError, match="canvas_length"):
        vb.canvas_length(wrapper)


# ---------------------------------------------------------------- weight sync
def test_load_weights_pushes_every_pair_in_place_and_drops_the_prefix_cache(policy):
    starts = Starts()
    backend = VLLMRollout(VLLMRolloutConfig(gen_length=4), start=starts)
    backend.load_weights(iter([("never", torch.zeros(1))]), 1)  # no engine yet: nothing to do
    assert not starts.llms
    ids, mask, _ = _prompts()
    backend.generate(policy, ids, mask)
    llm = starts.llms[0]
    state = {k: v + 1 for k, v in policy.module.state_dict().items()}
    state["model.decoder.norm.weight"].requires_grad_(True)  # live parameters are handed over detached
    backend.load_weights(state.items(), 1)
    reload = [c for c in llm.calls if c[:2] == ("rpc", "reload_weights")]
    assert len(reload) == 1 and reload[0][2]["is_checkpoint_format"] is True
    assert llm.calls[-1] == ("reset_prefix_cache",)
    pushed = llm.reloaded[0]
    assert [n for n, _ in pushed] == list(state)  # the checkpoint's published names, in order
    assert all(torch.equal(t, state[n]) and not t.requires_grad for n, t in pushed)
    assert all(t.data_ptr() != state[n].data_ptr() for n, t in llm.handed)  # copies, never the trainer's storage
    assert any(n.startswith("model.decoder.self_conditioning.") for n, _ in pushed)
    backend.close()


def test_a_tensor_parallel_engine_gets_cpu_tensors(policy):
    starts = Starts()
    backend = VLLMRollout(VLLMRolloutConfig(tensor_parallel_size=2), start=starts)
    ids, mask, _ = _prompts()
    backend.generate(policy, ids, mask)
    backend.load_weights(policy.module.state_dict().items(), 1)
    kwargs = [c for c in starts.llms[0].calls if c[:2] == ("rpc", "reload_weights")][0][2]
    assert isinstance(kwargs["weights_iterator"], list)
    assert all(t.device.type == "cpu" for _, t in kwargs["weights_iterator"])
    backend.close()


def test_a_lora_policy_is_exported_merged_and_left_as_it_is(tmp_path):
    peft = pytest.importorskip("peft")
    base = random_model(diffusion_gemma_config("tiny", canvas_length=8), seed=1)
    name = "model.decoder.layers.0.self_attn.q_proj.weight"
    w0 = base.state_dict()[name].clone()
    lora = peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=r".*decoder\.layers\.\d+\.self_attn\.q_proj", init_lora_weights=False
    )
    module = peft.get_peft_model(base, lora)
    wrapper = CheckpointPolicy(module)
    vb.export_policy(wrapper, str(tmp_path))
    exported = load_file(str(tmp_path / "model.safetensors"))
    q = module.base_model.model.model.decoder.layers[0].self_attn.q_proj
    delta = (4 / 2) * q.lora_B["default"].weight @ q.lora_A["default"].weight
    assert torch.allclose(exported[name], w0 + delta, atol=1e-6) and not torch.allclose(delta, torch.zeros_like(delta))
    assert isinstance(wrapper.module, peft.PeftModel) and torch.equal(q.base_layer.weight, w0)


def test_a_shared_engine_loads_each_steps_policy_once(policy):
    starts = Starts()
    train = VLLMRollout(VLLMRolloutConfig(gen_length=4), start=starts)
    evaluation = VLLMRollout(VLLMRolloutConfig(gen_length=8), start=starts)
    ids, mask, _ = _prompts()
    try:
        for backend in (train, evaluation):
            backend.generate(policy, ids, mask)
        assert len(starts.llms) == 1  # one engine for both backends
        for step in (1, 2):
            for backend in (train, evaluation):
                backend.load_weights(policy.module.state_dict().items(), step)
        assert len(starts.llms[0].reloaded) == 2
    finally:
        train.close()
