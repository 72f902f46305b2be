"""The ``deepspeed:`` section and the DeepSpeed config of a run: defaults, the JSON file's "auto"
fields filled from the run, contradictions refused in one line naming the field, refused
precision and paths, and ``dare list engines``. No process group, no DeepSpeed start-up."""

from __future__ import annotations

import json

import attrs
import pytest

import dare_plugin_deepspeed.plugin as plugin
from dare_core.config import resolve
from dare_core.errors import ConfigError, DareError
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.testing.registries import build_for
from dare_plugin_deepspeed.config import QUIET_STEPS, SECTION, DeepSpeedConfig, deepspeed_config
from dare_plugin_deepspeed.engine import DeepSpeedEngine


@pytest.fixture(scope="module")
def dare():
    return build_for(toy, DigitsPlugin(), plugin)


def _resolve(dare, tmp_path, *overrides):
    return resolve(
        dare,
        algo="sup_test",
        model="toy",
        overrides=[
            f"model.path={tmp_path / 'ckpt'}",
            f"output_dir={tmp_path}",
            "task.name=digits",
            "model.device=cpu",
            "engine.name=deepspeed",
            "trainer.micro_batch_size=2",
            *overrides,
        ],
    )


def _json(tmp_path, data) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    return str(path)


def _ds(dare, tmp_path, data=None, *overrides, precision="fp32", world=2):
    extra = [f"deepspeed.config={_json(tmp_path, data)}"] if data is not None else []
    cfg = _resolve(dare, tmp_path, *extra, *overrides)
    return deepspeed_config(cfg.plugin_section(SECTION), cfg.trainer, precision, world, "cpu")


def test_every_field_has_help_and_the_section_is_frozen():
    for f in attrs.fields(DeepSpeedConfig):
        assert f.metadata.get("help"), f.name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        DeepSpeedConfig().zero_stage = 3


def test_the_section_is_structured_from_overrides(dare, tmp_path):
    assert _resolve(dare, tmp_path).plugin_section(SECTION) == DeepSpeedConfig()
    cfg = _resolve(
        dare, tmp_path, "deepspeed.zero_stage=3", "deepspeed.offload_param=cpu", "deepspeed.offload_optimizer=cpu"
    )
    assert cfg.plugin_section(SECTION) == DeepSpeedConfig(3, "cpu", "cpu")


def test_section_problems_are_config_errors(dare, tmp_path):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, tmp_path, "deepspeed.zero_stage=4", "deepspeed.offload_optimizer=nvme")
    assert "\n" not in str(info.value)
    assert any(p.startswith("deepspeed.zero_stage:") for p in info.value.problems)
    assert any(p.startswith("deepspeed.offload_optimizer:") for p in info.value.problems)
    with pytest.raises(ConfigError) as info:
        _resolve(dare, tmp_path, "deepspeed.offload_param=cpu")
    assert info.value.problems == [
        "deepspeed.offload_param: offload_param=cpu needs zero_stage=3 (stages 1 "
        "and 2 keep whole parameters on every device), got zero_stage=2"
    ]


def test_without_a_file_the_run_sets_everything(dare, tmp_path):
    ds = _ds(dare, tmp_path, None, "trainer.grad_clip=0.5", "deepspeed.zero_stage=3", precision="bf16-mixed")
    assert ds == {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 4,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": True, "check_grad_overflow": True},
        "zero_optimization": {"stage": 3, "overlap_comm": False},
        "steps_per_print": QUIET_STEPS,
        "wall_clock_breakdown": False,
    }
    # offloading the optimizer steps it with DeepSpeed's CPU Adam: an optimizer section with the trainer's values
    ds = _ds(dare, tmp_path, None, "deepspeed.offload_optimizer=cpu", "trainer.lr=0.25", "trainer.beta2=0.95")
    assert ds["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    assert ds["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 0.25, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01},
    }
    assert ds["bf16"] == {"enabled": False}


def test_auto_fields_are_filled_from_the_run(dare, tmp_path):
    data = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": True},
        },
        "zero_optimization": {
            "stage": "auto",
            "offload_optimizer": {"device": "auto"},
            "reduce_bucket_size": "auto",
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": "auto",
        },
        "communication_data_type": "fp32",
    }
    ds = _ds(
        dare,
        tmp_path,
        data,
        "trainer.lr=0.001",
        "trainer.adam_eps=1e-6",
        "trainer.weight_decay=0.1",
        "trainer.grad_clip=2.0",
        "deepspeed.zero_stage=3",
        precision="bf16-mixed",
        world=4,
    )
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 1
    assert ds["train_batch_size"] == 8 and ds["gradient_clipping"] == 2.0
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert ds["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.1, "torch_adam": True},
    }
    # DeepSpeed's own settings stay; "auto" values DARE does not compute are dropped (DeepSpeed's defaults)
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "none"},
        "stage3_param_persistence_threshold": 0,
        "overlap_comm": False,
    }
    assert ds["communication_data_type"] == "fp32" and ds["managed_gradient_accumulation"] is False


def test_values_equal_to_the_run_are_kept(dare, tmp_path):
    data = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "optimizer": {"type": "adam", "params": {"lr": 5e-7, "betas": [0.9, 0.999]}},
    }
    ds = _ds(dare, tmp_path, data)
    assert ds["gradient_clipping"] == 1.0 and ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert ds["optimizer"]["type"] == "adam" and ds["optimizer"]["params"]["eps"] == 1e-8


@pytest.mark.parametrize(
    "data, overrides, message",
    [
        ({"gradient_clipping": 0.5}, (), "gradient_clipping=0.5 contradicts trainer.grad_clip=1.0"),
        (
            {"train_micro_batch_size_per_gpu": 16},
            (),
            "train_micro_batch_size_per_gpu=16 contradicts trainer.micro_batch_size=2",
        ),
        ({"gradient_accumulation_steps": 8}, (), "gradient_accumulation_steps=8 contradicts the deepspeed engine"),
        ({"train_batch_size": 64}, (), "train_batch_size=64 contradicts trainer.micro_batch_size x 2 processes"),
        ({"bf16": {"enabled": True}}, (), "bf16.enabled=true contradicts engine.precision=fp32"),
        ({"fp16": {"enabled": True}}, (), "fp16.enabled=true contradicts engine.precision=fp32"),
        ({"zero_optimization": {"stage": 3}}, (), "zero_optimization.stage=3 contradicts deepspeed.zero_stage=2"),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
            (),
            'zero_optimization.offload_optimizer.device="cpu" contradicts deepspeed.offload_optimizer="none"',
        ),
        (
            {"zero_optimization": {"overlap_comm": True}},
            ("deepspeed.zero_stage=3",),
            "zero_optimization.overlap_comm=true contradicts deepspeed.zero_stage=3",
        ),
        (
            {"zero_optimization": {"compute_grad_norm": False}},
            (),
            "zero_optimization.compute_grad_norm=false contradicts the engine",
        ),
        (
            {"managed_gradient_accumulation": True},
            (),
            "managed_gradient_accumulation=true contradicts the deepspeed engine",
        ),
        ({"optimizer": {"params": {"lr": 0.1}}}, (), "optimizer.params.lr=0.1 contradicts trainer.lr=5e-07"),
        (
            {"optimizer": {"params": {"betas": [0.9, 0.95]}}},
            (),
            "optimizer.params.betas=[0.9, 0.95] contradicts [trainer.beta1, trainer.beta2]=[0.9, 0.999]",
        ),
        (
            {"optimizer": {"params": {"weight_decay": 0.0}}},
            (),
            "optimizer.params.weight_decay=0.0 contradicts trainer.weight_decay=0.01",
        ),
        ({"optimizer": {"type": "Lion"}}, (), "optimizer.type: 'Lion' is not AdamW"),
        ({"optimizer": {"params": {"adam_w_mode": False}}}, (), "optimizer.params.adam_w_mode: false makes Adam"),
        ({"scheduler": {"type": "WarmupLR"}}, (), "scheduler: DARE sets the learning rate of every step"),
        ({"bf16": {"check_grad_overflow": False}}, (), None),  # fp32: bf16 settings do not apply
    ],
)
def test_contradictions_are_refused_in_one_line_naming_the_field(dare, tmp_path, data, overrides, message):
    if message is None:
        _ds(dare, tmp_path, data, *overrides)
        return
    with pytest.raises(DareError) as info:
        _ds(dare, tmp_path, data, *overrides)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"deepspeed.config {tmp_path / 'ds.json'}: ")
    assert message in text


def test_bf16_overflow_checks_stay_on(dare, tmp_path):
    with pytest.raises(DareError, match="bf16.check_grad_overflow=false contradicts"):
        _ds(dare, tmp_path, {"bf16": {"check_grad_overflow": False}}, precision="bf16-mixed")


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{nope", "not a JSON file"),
        ("[1, 2]", "expected a JSON object"),
        ('{"zero_optimization": 3}', "zero_optimization must be a mapping, got 3"),
    ],
)
def test_unreadable_files_are_one_line_errors(dare, tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    cfg = _resolve(dare, tmp_path, f"deepspeed.config={path}")
    with pytest.raises(DareError) as info:
        deepspeed_config(cfg.plugin_section(SECTION), cfg.trainer, "fp32", 2, "cpu")
    assert "\n" not in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("update", ["none", "kahan"])
def test_pure_bf16_is_refused_in_one_line(dare, tmp_path, update):
    cfg = _resolve(dare, tmp_path, "engine.precision=bf16", f"engine.bf16_update={update}")
    with pytest.raises(DareError) as info:
        DeepSpeedEngine(cfg)
    assert str(info.value) == (
        "engine.name=deepspeed does not run engine.precision=bf16: DeepSpeed keeps "
        "fp32 master weights of bf16 parameters; use engine.precision=bf16-mixed"
    )


def test_zero3_refuses_a_forced_fused_cross_entropy(dare, tmp_path):
    cfg = _resolve(dare, tmp_path, "deepspeed.zero_stage=3", "model.cross_entropy=fused")
    with pytest.raises(DareError, match=r"^model.cross_entropy=fused reads the output head .* zero_stage 1 or 2$"):
        DeepSpeedEngine(cfg)


def test_without_a_launcher_the_engine_says_how_to_start(dare, tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(DareError, match="needs RANK and WORLD_SIZE from its launcher"):
        DeepSpeedEngine(_resolve(dare, tmp_path))


def test_dare_list_engines_shows_deepspeed():
    from click.testing import CliRunner

    from dare_core.cli import cli

    result = CliRunner().invoke(cli, ["list", "engines", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["engine"]: r for r in json.loads(result.output)}
    assert rows["deepspeed"]["launcher"] == "torchrun"
    assert "ZeRO stage 1/2/3" in rows["deepspeed"]["description"]
