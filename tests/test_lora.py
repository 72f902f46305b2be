"""LoRA through PEFT on the family-free toy model: only adapters train (the base stays
bit-identical), adapters save in PEFT layout and reload to the same greedy generations, merging,
family defaults for the target modules, and one-line config errors."""

import json
import os

import pytest
import torch

import dare_plugin_samplers  # the reference rollout backends the loops run with
import dare_plugin_tasks  # the default task of the run config
from dare_core.config import resolve
from dare_core.errors import ConfigError, DareError
from dare_core.models import lora
from dare_core.plugins import build
from dare_core.rundir import RunDir
from dare_core.testing import digits, make_toy_wrapper, toy
from dare_core.workflows.rl import run_rl
from dare_core.workflows.runtime import load_model, setup
from dare_core.workflows.sft import run_sft

pytest.importorskip("peft")

TARGETS = ("mlp.0", "mlp.2", "head")


class DigitsTask(digits.DigitsTask):
    default_limit = 32


@pytest.fixture
def dare():
    return build(
        load_entrypoints=False,
        extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy, digits.DigitsPlugin(task=DigitsTask)],
    )


COMMON = [
    "task.name=digits",
    "task.num_eval=8",
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "rollout.steps=4",
    "eval.batch_size=8",
    "progress=false",
    "seed=3",
    "eval.before=false",
    "eval.after=false",
    f"model.lora.target_modules=[{','.join(TARGETS)}]",
]


def _greedy(dare, cfg, wrapper):
    from dare_core.workflows.batching import decode_responses, left_pad
    from dare_core.workflows.runtime import build_rollout

    backend = build_rollout(dare, cfg)
    prompts = [wrapper.encode(wrapper.render_prompt([{"role": "user", "content": f"n{i}"}])) for i in range(6)]
    ids, mask = left_pad(prompts, wrapper.pad_token_id)
    out = backend.generate(wrapper, ids, mask, generator=torch.Generator().manual_seed(0))
    return out.response_ids.tolist(), decode_responses(wrapper, out.response_ids, out.response_mask)


@pytest.mark.parametrize(
    "algo,extra",
    [
        (
            "pg_test",
            ["trainer.batch_size=4", "trainer.group_size=4", "trainer.micro_batch_size=16", "rollout.temperature=1.0"],
        ),
        ("sup_test", ["trainer.batch_size=8", "trainer.micro_batch_size=8", "rollout.temperature=0"]),
    ],
)
def test_only_adapters_train_base_bit_identical_and_adapter_round_trip(dare, tmp_path, algo, extra):
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    cfg = resolve(
        dare,
        algo=algo,
        model="toy",
        overrides=COMMON
        + extra
        + [
            f"model.path={base_dir}",
            f"output_dir={tmp_path}",
            "run_name=run",
            "trainer.steps=4",
            "trainer.lr=5e-2",
            "model.lora.rank=4",
            "model.lora.alpha=8",
        ],
    )
    ctx = setup(dare, cfg, rundir=RunDir(str(tmp_path / "run")))
    assert lora.is_lora(ctx.wrapper)
    initial = {k: v.clone() for k, v in make_toy_wrapper().module.state_dict().items()}
    trainable = {n for n, p in ctx.wrapper.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    lora_before = {n: p.detach().clone() for n, p in ctx.wrapper.module.named_parameters() if p.requires_grad}

    (run_rl if algo == "pg_test" else run_sft)(ctx)

    # the base weights are bit-identical to the checkpoint's; the adapters moved
    base_now = {
        k.replace(".base_layer", ""): v
        for k, v in ctx.wrapper.module.get_base_model().state_dict().items()
        if "lora_" not in k
    }
    assert set(base_now) == set(initial)
    for k, v in initial.items():
        assert torch.equal(base_now[k], v), k
    moved = [
        n
        for n, p in ctx.wrapper.module.named_parameters()
        if p.requires_grad and not torch.equal(p.detach(), lora_before[n])
    ]
    assert any("lora_B" in n for n in moved)  # B starts at 0: only a real gradient moves it

    # PEFT layout in the final checkpoint, written by the run directory
    final = tmp_path / "run" / "final"
    assert (final / "lora_adapter" / "adapter_config.json").exists()
    assert (final / "lora_adapter" / "adapter_model.safetensors").exists()
    saved = json.loads((final / "lora_adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["lora_alpha"] == 8
    assert saved["base_model_name_or_path"] == os.path.abspath(base_dir)
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "run").iterdir())

    # reload (a) through model.path=<checkpoint>, (b) through model.lora.adapter=<dir>
    ctx.wrapper.module.eval()
    greedy = resolve(
        dare,
        model="toy",
        need_algo=False,
        overrides=[o for o in COMMON if "target_modules" not in o]
        + ["rollout.temperature=0", f"model.path={base_dir}"],
    )
    trained_ids, trained_text = _greedy(dare, greedy, ctx.wrapper)
    for over in ([f"model.path={final}"], [f"model.path={base_dir}", f"model.lora.adapter={final / 'lora_adapter'}"]):
        gcfg = resolve(
            dare,
            model="toy",
            need_algo=False,
            overrides=[o for o in COMMON if "target_modules" not in o] + over + ["rollout.temperature=0"],
        )
        again = load_model(dare, gcfg, trainable=False)
        assert lora.is_lora(again)
        assert not any(p.requires_grad for p in again.module.parameters())
        ids, text = _greedy(dare, greedy, again)
        assert ids == trained_ids and text == trained_text
    # and the adapters matter: the base model alone generates something else or scores differently
    plain = make_toy_wrapper()
    x = torch.tensor([plain.encode("assistant: n1")])
    assert not torch.allclose(plain.logits(x), ctx.wrapper.logits(x))


def _lora_cfg(tmp_path, *overrides):
    dare = build(load_entrypoints=False, extra_plugins=[dare_plugin_samplers, dare_plugin_tasks, toy])
    return resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={tmp_path}", *overrides]).model.lora


def test_merge_on_save_writes_equivalent_full_weights(tmp_path):
    w = make_toy_wrapper()
    cfg = _lora_cfg(
        tmp_path,
        "model.lora.rank=2",
        f"model.lora.target_modules=[{','.join(TARGETS)}]",
        "model.lora.merge_on_save=true",
    )
    lora.apply_lora(w, cfg)
    with torch.no_grad():
        for n, p in w.module.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    lora.save_checkpoint(w, str(tmp_path / "ck"), merge=True)
    assert (tmp_path / "ck" / "toy.pt").exists() and (tmp_path / "ck" / "lora_adapter").is_dir()
    merged = toy.load(str(tmp_path / "ck"))
    x = torch.tensor([w.encode("assistant: n123")])
    torch.testing.assert_close(merged.logits(x), w.logits(x), rtol=1e-5, atol=1e-5)
    assert lora.is_lora(w)  # merging for the save leaves the training model as it was
    base, adapter = lora.resolve_checkpoint(str(tmp_path / "ck"))
    assert adapter is None  # full weights are there: the checkpoint is its own base


def test_target_modules_come_from_the_family_wrapper_or_all_linear(tmp_path):
    w = make_toy_wrapper()
    assert lora.target_modules(w, None) == "all-linear"
    w.lora_target_modules = ("mlp.0",)
    assert lora.target_modules(w, None) == ["mlp.0"]
    assert lora.target_modules(w, ("head",)) == ["head"]
    assert lora.target_modules(w, ("all-linear",)) == "all-linear"
    lora.apply_lora(w, _lora_cfg(tmp_path, "model.lora.rank=2"))
    adapted = {n.split(".lora_A")[0] for n, _ in w.module.named_parameters() if "lora_A" in n}
    assert adapted == {"base_model.model.mlp.0"}


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.lora.rank=0", "model.lora.rank: must be a positive integer (null = no LoRA), got 0"),
        ("model.lora.rank=-3", "model.lora.rank: must be a positive integer"),
        ("model.lora.alpha=0", "model.lora.alpha: must be > 0"),
        ("model.lora.dropout=1.5", "model.lora.dropout: must be in [0.0, 1.0)"),
        ("model.lora.target_modules=[]", "model.lora.target_modules: must be null"),
        ("model.lora.rnk=8", "model.lora.rnk: unknown key (did you mean 'rank'?)"),
    ],
)
def test_config_errors_are_one_line(override, message, tmp_path):
    with pytest.raises(ConfigError) as info:
        _lora_cfg(tmp_path, override)
    text = str(info.value)
    assert message in text
    assert len([line for line in text.splitlines() if line.strip()]) <= 2


def test_unknown_target_module_and_missing_adapter_are_dare_errors(tmp_path):
    cfg = _lora_cfg(tmp_path, "model.lora.rank=2", "model.lora.target_modules=[no_such_layer]")
    with pytest.raises(DareError, match="model.lora.target_modules"):
        lora.apply_lora(make_toy_wrapper(), cfg)
    cfg2 = _lora_cfg(tmp_path, f"model.lora.adapter={tmp_path}")
    with pytest.raises(DareError, match="holds no adapter_config.json"):
        lora.apply_lora(make_toy_wrapper(), cfg2)
