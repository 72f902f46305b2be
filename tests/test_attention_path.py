"""Automatic choice of the training attention path and cross-entropy head, overrides, run log."""

import json

import pytest
import torch

import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core.config import resolve
from dare_core.errors import DareError
from dare_core.interfaces import Example, Score
from dare_core.ops.attention import available_kernels
from dare_core.ops.paths import configure_training_paths, select_training_paths
from dare_core.plugins import build
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin, DigitsTask
from dare_core.train import train


def _toy(pack=False, hidden=True):
    w = toy.make_toy_wrapper()
    if pack:
        w.capabilities = w.capabilities | {"packed_varlen"}
    if not hidden:

        class NoHidden(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, **kw):
                return self.inner(**kw)

        w.module = NoHidden(w.module)
    return w


def test_auto_follows_capabilities():
    p = select_training_paths(_toy(pack=False), "auto", "auto", "cpu")
    assert (p.attention, p.fused_ce) == ("padded", True)
    p = select_training_paths(_toy(pack=True), "auto", "auto", "cpu")
    assert (p.attention, p.attention_kernel, p.fused_ce) == ("packed", "sdpa_mask", True)
    p = select_training_paths(_toy(pack=True, hidden=False), "auto", "auto", "cpu")
    assert (p.attention, p.fused_ce) == ("packed", False)


def test_overrides_and_one_line_errors():
    p = select_training_paths(_toy(pack=True), "padded", "naive", "cpu")
    assert (p.attention, p.fused_ce) == ("padded", False)
    with pytest.raises(DareError) as e:
        select_training_paths(_toy(pack=False), "packed", "auto", "cpu")
    assert "\n" not in str(e.value) and "model.train_attention=padded" in str(e.value)
    with pytest.raises(DareError) as e:
        select_training_paths(_toy(hidden=False), "auto", "fused", "cpu")
    assert "\n" not in str(e.value) and "model.cross_entropy=naive" in str(e.value)
    with pytest.raises(DareError, match="not one of"):
        select_training_paths(_toy(), "flash", "auto", "cpu")


def test_block_layout_wrapper_is_not_packed_or_fused_without_denoise_hidden():
    w = _toy(pack=True)

    class BlockLike(type(w)):
        def denoise_logits(self, noisy_ids, attention_mask=None, clean_ids=None):
            return self.logits(noisy_ids, attention_mask)

    w.__class__ = BlockLike
    p = select_training_paths(w, "auto", "auto", "cpu")
    assert (p.attention, p.fused_ce) == ("padded", False)


def test_configure_sets_the_wrapper_and_describes_itself():
    w = _toy(pack=True)
    p = configure_training_paths(w, "auto", "auto", "cpu")
    assert w.train_attention == "packed" and w.fused_ce is True and w.training_paths == p
    text = p.describe()
    assert "attention=packed" in text and "cross entropy=fused" in text
    assert available_kernels("cpu") == ("sdpa_mask",)


class _Task(DigitsTask):
    default_limit = 16

    def examples(self, split, limit=None, seed=0):
        return [
            Example([{"role": "user", "content": f"n{i}"}], str(i % 10), "digits", response=str(i % 10) * (1 + i % 5))
            for i in range(limit or self.default_limit)
        ]

    def score(self, example, response):
        return Score(0.0, 0.0, response)


def _plugin():
    return DigitsPlugin(task=_Task, rl_name=None, sft_name="sup_paths")


@pytest.mark.parametrize(
    "override,attention,fused",
    [
        ([], "padded", True),
        (["model.cross_entropy=naive"], "padded", False),
    ],
)
def test_run_log_states_the_paths(tmp_path, capsys, override, attention, fused):
    dare = build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, _plugin()])
    cfg = resolve(
        dare,
        algo="sup_paths",
        model="toy",
        overrides=[
            "task.name=digits",
            "progress=false",
            "eval.before=false",
            "eval.after=false",
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=r",
            "trainer.steps=1",
            "trainer.batch_size=4",
            "trainer.micro_batch_size=4",
            "trainer.save_final=false",
        ]
        + override,
    )
    train(dare, cfg)
    err = capsys.readouterr().err
    assert f"training paths: attention={attention}" in err
    assert ("cross entropy=fused" in err) == fused
    stored = json.loads((tmp_path / "r" / "training_paths.json").read_text())
    assert stored["attention"] == attention and stored["fused_ce"] == fused


def test_forcing_packed_on_a_model_without_it_fails_at_setup(tmp_path):
    dare = build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, _plugin()])
    cfg = resolve(
        dare,
        algo="sup_paths",
        model="toy",
        overrides=[
            "task.name=digits",
            "progress=false",
            "eval.before=false",
            "eval.after=false",
            f"model.path={tmp_path}",
            f"output_dir={tmp_path}",
            "run_name=r",
            "trainer.steps=1",
            "model.train_attention=packed",
        ],
    )
    with pytest.raises(DareError, match="model.train_attention=packed"):
        train(dare, cfg)


def test_config_rejects_unknown_choice(tmp_path):
    dare = build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, _plugin()])
    with pytest.raises(DareError) as e:
        resolve(dare, algo="sup_paths", model="toy", overrides=["model.cross_entropy=maybe", f"model.path={tmp_path}"])
    assert "cross_entropy" in str(e.value)


def test_kernel_choice_follows_device_and_dtype():
    # the choice needs no GPU: only what torch provides and the dtype of the weights
    assert available_kernels("cuda", torch.float32) == ("sdpa_mask", "flex")
    assert "varlen" in available_kernels("cuda", torch.bfloat16)
    w = _toy(pack=True)
    # the measured-fastest kernel (sdpa_mask) is the default on CUDA too, in every dtype
    assert select_training_paths(w, "auto", "auto", "cuda").attention_kernel == "sdpa_mask"
    w.module.to(torch.bfloat16)
    assert select_training_paths(w, "auto", "auto", "cuda").attention_kernel == "sdpa_mask"
    p = select_training_paths(w, "auto", "auto", "cuda", attention_kernel="varlen")
    assert p.attention_kernel == "varlen" and "varlen_attn" in p.describe()
    p = select_training_paths(w, "auto", "auto", "cuda", attention_kernel="flex")
    assert p.attention_kernel == "flex" and "FlexAttention" in p.describe() and "requested flex" in p.describe()


def test_kernel_errors_are_one_line():
    with pytest.raises(DareError) as e:
        select_training_paths(_toy(pack=True), "auto", "auto", "cpu", attention_kernel="flex")
    assert "\n" not in str(e.value) and "runnable here: sdpa_mask" in str(e.value)
    with pytest.raises(DareError) as e:
        select_training_paths(_toy(pack=True), "auto", "auto", "cuda", attention_kernel="varlen")
    assert "float32" in str(e.value) and "flex" in str(e.value)
    with pytest.raises(DareError) as e:
        select_training_paths(_toy(pack=True), "padded", "auto", "cpu", attention_kernel="sdpa_mask")
    assert "\n" not in str(e.value) and "model.train_attention=packed" in str(e.value)
    with pytest.raises(DareError, match="not one of"):
        select_training_paths(_toy(pack=True), "auto", "auto", "cpu", attention_kernel="triton")


def test_configure_sets_the_kernel_the_wrapper_packs_with():
    from dare_core.ops.attention import DocumentMask
    from dare_core.ops.packing import plan_packing

    w = _toy(pack=True)
    configure_training_paths(w, "auto", "auto", "cpu", attention_kernel="sdpa_mask")
    assert w.attention_kernel == "sdpa_mask"
    plan = plan_packing(torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert plan.attention_mask().dtype == torch.bool
    doc = plan.attention_mask("flex")
    assert isinstance(doc, DocumentMask) and doc.kernel == "flex" and doc.doc_ids.equal(plan.doc_ids)
    with pytest.raises(ValueError, match="unknown document attention kernel"):
        plan.attention_mask("triton")
