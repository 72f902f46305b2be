"""Per-layer sharding on a model with decoder layers: the bundled tiny LLaDA checkpoint
(dare-plugin-llada; 4 blocks) with HF activation checkpointing and the logits-free cross
entropy, two optimizer steps on 2 gloo ranks against the single-process engine, the reference
copy, a model prepared for inference only, and the state round trip
(:func:`fsdp_runs.llada_steps`)."""

from __future__ import annotations

import pytest
from fsdp_runs import llada_batch

pytest.importorskip("dare_plugin_llada")


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    return llada_batch(str(tmp_path_factory.mktemp("llada")))


def test_every_decoder_layer_is_an_fsdp_unit_holding_half_the_weights(facts):
    assert facts["layers"] == 4 and facts["sharded"]
    assert facts["local_fraction"] == pytest.approx(0.5, abs=0.01)


def test_two_steps_with_activation_checkpointing_equal_one_process(facts):
    assert facts["checkpointing"]
    assert facts["keys_match"]
    assert facts["norms"][0] == pytest.approx(facts["norms"][1], rel=1e-5)
    assert facts["moved"] > 1e-3  # the steps changed the weights (lr 1e-3) ...
    assert facts["weight_diff"] < 1e-5  # ... as one process on the whole batch does


def test_the_reference_copy_is_sharded_and_computes_what_the_policy_does(facts):
    assert facts["reference_sharded"]
    assert facts["reference_diff"] == 0.0


def test_a_model_prepared_for_inference_only_computes_the_checkpoint_s_logits(facts):
    assert facts["inference_diff"] < 1e-5


def test_loading_the_saved_state_repeats_the_second_step_exactly(facts):
    assert facts["resumed_diff"] == 0.0
