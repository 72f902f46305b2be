"""The reference policy (RL and preference workflows) under LoRA: with fresh adapters it is the
base model with the adapters switched off (no copy), with a loaded adapter the engine's frozen
copy."""

import pytest
import torch

import dare_plugin_samplers  # the toy family's default rollout backend
import dare_plugin_tasks  # the run config's default task
from dare_core.api import MaskedTokenLogProb, RandomRatioMasking, ReferencePolicy, SingleProcessEngine, resolve
from dare_core.models import lora
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.registries import build_for
from dare_core.testing.toy import fake_rollout

pytest.importorskip("peft")

TARGETS = ("mlp.0", "mlp.2", "head")


def _lora_cfg(tmp_path, *overrides):
    dare = build_for(toy, dare_plugin_samplers, dare_plugin_tasks)
    return resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={tmp_path}", *overrides]).model.lora


def _engine(tmp_path):
    dare = build_for(toy, dare_plugin_samplers, dare_plugin_tasks)
    return SingleProcessEngine(
        resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={tmp_path}", "model.device=cpu"])
    )


def test_reference_is_the_base_for_fresh_adapters_and_a_copy_otherwise(tmp_path):
    est, corrupt = MaskedTokenLogProb(), RandomRatioMasking(mc_num=2)
    engine = _engine(tmp_path)
    w = make_toy_wrapper()
    batch = fake_rollout(w).sequences()
    c = corrupt(w, batch, torch.Generator().manual_seed(0))
    base_values = est(w, batch, c).detach()
    lora.apply_lora(w, _lora_cfg(tmp_path, "model.lora.rank=2", f"model.lora.target_modules=[{','.join(TARGETS)}]"))
    with torch.no_grad():
        for n, p in w.module.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # as if trained: the policy now differs from the base
    adapted = est(w, batch, c).detach()
    assert not torch.allclose(adapted, base_values)
    ref = ReferencePolicy(w, engine)
    assert ref.shared and ref.copy is None  # fresh adapters: no copy of the model
    torch.testing.assert_close(ref.estimate(engine, est, batch, c, 2), base_values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(est(w, batch, c), adapted)  # adapters are on again afterwards
    # a loaded adapter is the initial policy itself: the reference is a frozen copy of it
    lora.save_checkpoint(w, str(tmp_path / "ck"))
    again = lora.apply_lora(make_toy_wrapper(), _lora_cfg(tmp_path, f"model.lora.adapter={tmp_path / 'ck'}"))
    ref2 = ReferencePolicy(again, engine)
    assert not ref2.shared
    torch.testing.assert_close(ref2.estimate(engine, est, batch, c, 4), adapted, rtol=1e-5, atol=1e-5)
