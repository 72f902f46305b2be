"""The reference policy of the preference workflow under LoRA: with fresh adapters it is the
base model with the adapters switched off (no copy), with a loaded adapter a frozen copy."""

import pytest
import torch

from dare_core.api import resolve
from dare_core.models import lora
from dare_core.testing import make_toy_wrapper, toy
from dare_core.testing.registries import build_for
from dare_core.testing.toy import fake_rollout
from dare_objectives.elbo import SequenceELBO, StratifiedCountMasking
from dare_plugin_preference import plugin
from dare_plugin_preference.workflow import Reference

pytest.importorskip("peft")

TARGETS = ("mlp.0", "mlp.2", "head")


def _lora_cfg(tmp_path, *overrides):
    dare = build_for(plugin, toy)
    return resolve(dare, model="toy", need_algo=False,
                   overrides=[f"model.path={tmp_path}", *overrides]).model.lora


def test_reference_is_the_base_for_fresh_adapters_and_a_copy_otherwise(tmp_path):
    est, corrupt = SequenceELBO(norm="none"), StratifiedCountMasking(mc_num=2, n_l=2)
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
    ref = Reference(w)
    assert ref.shared and ref.copy is None  # fresh adapters: no copy of the model
    torch.testing.assert_close(ref.estimate(est, batch, c, 2), base_values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(est(w, batch, c), adapted)  # adapters are on again afterwards
    # a loaded adapter is the initial policy itself: the reference is a frozen copy of it
    lora.save_checkpoint(w, str(tmp_path / "ck"))
    again = lora.apply_lora(make_toy_wrapper(), _lora_cfg(tmp_path, f"model.lora.adapter={tmp_path / 'ck'}"))
    ref2 = Reference(again)
    assert not ref2.shared
    torch.testing.assert_close(ref2.estimate(est, batch, c, 4), adapted, rtol=1e-5, atol=1e-5)
