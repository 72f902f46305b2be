"""``dare bench train`` end to end on tiny sizes (numbers are not asserted, only their form and
the equalities the bench reports)."""

import json

import pytest

from dare_core.interfaces import ModelFamily
from dare_core.plugins import hookimpl
from dare_core.testing import toy
from dare_core.testing.registries import build_for
from dare_plugin_bench.common import BenchError
from dare_plugin_bench.train import main


class _PackableToy:
    """A test family: the toy model with the packed_varlen capability (it takes position ids
    and 4-D boolean masks)."""

    @hookimpl
    def dare_register_model_wrappers(self, register):
        def load(path, dtype=None, device="cpu", attn_implementation=None):
            w = toy.load(path, device=device)
            w.capabilities = w.capabilities | {"packed_varlen"}
            return w

        register(
            ModelFamily(
                name="toy_packable",
                kind="masked",
                load=load,
                capabilities=frozenset({"bidirectional", "packed_varlen", "mask_token", "absorbing_elbo"}),
                default_rollout="low_confidence",
                rollouts=("low_confidence",),
            )
        )


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_both_parts_report_ratios_and_equal_losses(tmp_path, capsys):
    # 64 x 150,000 float32 logits (37 MiB) exceed glibc's largest mmap threshold (32 MiB), so the
    # naive head's peak shows in the RSS however the process allocated before
    dare = build_for(_PackableToy())
    rc = main(
        [
            "--model",
            "toy_packable",
            "--checkpoint",
            str(tmp_path),
            "--batch",
            "4",
            "--prompt-length",
            "8",
            "--ragged",
            "3",
            "--min-response",
            "4",
            "--max-response",
            "40",
            "--tokens",
            "64",
            "--vocab",
            "150000",
            "--hidden",
            "16",
            "--chunk",
            "16",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
        ],
        dare=dare,
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "padded" in out and "packed" in out and "naive" in out and "fused" in out
    data = _last_json(out)
    pk, ce = data["packing"], data["cross_entropy"]
    assert sorted(pk["response_lengths"]) == [4, 16, 28, 40]
    assert pk["packed_shape"][0] < pk["padded_shape"][0]
    assert "attention=packed" in pk["packed"]["path"] and "attention=padded" in pk["padded"]["path"]
    assert pk["loss_rel_diff"] < 1e-5 and pk["grad_rel_diff"] < 1e-4
    assert ce["chunk_rows"] == 16 and max(ce["rel_diff"].values()) < 1e-5
    assert data["ratios"]["packed_over_padded_tokens_per_s"] > 0
    assert data["ratios"]["fused_over_naive_peak_memory"] is not None
    assert data["machine"]["cpu_count"] >= 1


def test_argument_errors_are_one_line():
    with pytest.raises(BenchError, match="--model"):
        main(["--part", "packing"])
    with pytest.raises(BenchError, match="--min-response"):
        main(["--part", "ce", "--min-response", "9", "--max-response", "3"])
    with pytest.raises(BenchError, match="--random"):
        main(["--part", "ce", "--size", "d_model=8"])


def test_bf16_cross_entropy_reports_distance_to_float64(capsys):
    rc = main(
        [
            "--part",
            "ce",
            "--ce-dtype",
            "bfloat16",
            "--tokens",
            "96",
            "--vocab",
            "2000",
            "--hidden",
            "32",
            "--chunk",
            "20",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    ce = _last_json(capsys.readouterr().out)["cross_entropy"]
    ref = ce["rel_diff_to_float64"]
    # float32 accumulation of the weight gradient: closer to float64 than the bf16 naive form
    assert ref["fused_grad_w"] < ref["naive_grad_w"]
    assert ref["fused_loss"] < 1e-4 and ce["rel_diff"]["loss"] < 1e-5


def test_moe_part_times_the_block_the_sdar_family_builds(capsys):
    import dare_plugin_sdar

    args = ["--part", "moe", "--moe-tokens", "16", "--moe-hidden", "32", "--moe-intermediate", "16"]
    args += ["--moe-experts", "2,4", "--moe-top-k", "2", "--repeats", "1", "--warmup", "0", "--threads", "1"]
    assert main(args, dare=build_for(dare_plugin_sdar)) == 0
    moe = _last_json(capsys.readouterr().out)["moe"]
    assert sorted(moe["by_experts"]) == ["2", "4"]
    for res in moe["by_experts"].values():
        assert set(res["rel_diff"]) == {"out", "grad_x", "grads"}
        assert max(res["rel_diff"].values()) <= 1e-5  # grouped experts equal the per-expert loop in fp32
        assert res["loop"]["seconds"] > 0 and res["grouped"]["seconds"] > 0


def test_moe_part_names_the_family_it_needs():
    with pytest.raises(BenchError, match="install dare-plugin-sdar"):
        main(["--part", "moe", "--moe-experts", "2", "--moe-top-k", "2"], dare=build_for())
