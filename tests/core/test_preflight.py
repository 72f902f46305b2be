"""Checks before any work (:mod:`dare_core.preflight`, the semantic checks of config resolution)
and the run-directory rules, mostly through the ``dare`` command: each refusal is one ``error:``
line with exit status 2 and no traceback, comes before a model is loaded and leaves no run
directory behind.

The damaged checkpoints are copies of a small Hugging Face-layout checkpoint of a test family
``hf_toy`` (``config.json``, ``model.safetensors``, the toy's character tokenizer), damaged in
``tmp_path``.
"""

from __future__ import annotations

import json
import os
import types

import attrs
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

import dare_core.preflight as preflight_mod
from dare_core.cli import cli
from dare_core.config import resolve
from dare_core.interfaces import AlgorithmSpec, ModelFamily
from dare_core.testing.toy import make_char_tokenizer

FIX = "re-download or re-export the checkpoint"
CONFIG = {"model_type": "hf_toy", "vocab_size": 100, "dim": 4, "max_len": 4096}
LOADS: list = []


def _load(path, *args, **kwargs):
    LOADS.append(path)
    raise AssertionError("a refused run loaded a model")


ABSORBING = frozenset({"mask_token", "absorbing_elbo"})


def _families(register):
    register(
        ModelFamily(
            name="hf_toy",
            kind="masked",
            load=_load,
            model_types=("hf_toy",),
            config_keys=("vocab_size", "dim"),
            context_key="max_len",
            capabilities=ABSORBING,
            default_rollout="low_confidence",
            rollouts=("low_confidence",),
        )
    )
    register(
        ModelFamily(
            name="other_toy",
            kind="masked",
            load=_load,
            model_types=("other_toy",),
            capabilities=ABSORBING,
            default_rollout="low_confidence",
            rollouts=("low_confidence",),
        )
    )


@pytest.fixture
def hf_ckpt(tmp_path):
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    save_file({"embed": torch.zeros(100, 4), "head": torch.zeros(4, 100)}, str(path / "model.safetensors"))
    make_char_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture
def dare(make_dare, make_plugin):
    return make_dare(make_plugin("hf_families", dare_register_model_wrappers=_families))


@pytest.fixture
def refused(dare, use_dare, tmp_path, load_calls):
    """``refused(*args)``: runs ``dare ARGS``, checks it is refused in one line before any model
    is loaded with no run directory under ``tmp_path/runs``; returns the message."""
    use_dare(dare)
    LOADS.clear()

    def run(*args):
        result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="dare")
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and result.stdout == ""
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ")
        assert LOADS == [] and load_calls == []
        runs = tmp_path / "runs"
        assert not runs.exists() or os.listdir(runs) == []
        return line[len("error: ") :]

    return run


def _train(tmp_path, ckpt, *more):
    return (
        "train",
        "--algo",
        "algo_a",
        "--model",
        "hf_toy",
        f"model.path={ckpt}",
        f"output_dir={tmp_path / 'runs'}",
        "trainer.max_prompt_length=4096",
        *more,
    )


COMMANDS = {
    "train": lambda tmp_path, ckpt: _train(tmp_path, ckpt),
    "generate": lambda tmp_path, ckpt: ("generate", "--model", "hf_toy", "--prompt", "hi", f"model.path={ckpt}"),
}


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _shards(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"embed": "model-00001-of-00002.safetensors", "head": "model-00002-of-00002.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))


DAMAGE = {
    "truncated config.json": (
        lambda c: (c / "config.json").write_text('{"model_type": "hf_to'),
        "config.json is not readable JSON (Unterminated string",
    ),
    "config.json not an object": (
        lambda c: (c / "config.json").write_text("[1, 2]"),
        "config.json holds a JSON list, not an object",
    ),
    "config.json with only model_type": (
        lambda c: (c / "config.json").write_text('{"model_type": "hf_toy"}'),
        "config.json lacks vocab_size, dim (the sizes of a 'hf_toy' model)",
    ),
    "missing weights": (
        lambda c: (c / "model.safetensors").unlink(),
        "holds no weights (model.safetensors or pytorch_model.bin, or a sharded index",
    ),
    "truncated safetensors": (
        lambda c: _truncate(c / "model.safetensors"),
        "model.safetensors is truncated or not a safetensors file",
    ),
    "missing shard": (_shards, "model-00002-of-00002.safetensors, named by the weights index, is missing"),
    "corrupt tokenizer.json": (
        lambda c: (c / "tokenizer.json").write_text("{not json"),
        "tokenizer.json is not readable JSON (Expecting property name",
    ),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_refused_in_one_line(refused, tmp_path, hf_ckpt, command, damage):
    spoil, expected = DAMAGE[damage]
    spoil(hf_ckpt)
    message = refused(*COMMANDS[command](tmp_path, hf_ckpt))
    assert expected in message and message.endswith(FIX)


def test_the_intact_checkpoint_passes_every_check(dare, hf_ckpt, tmp_path):
    cfg = resolve(
        dare,
        algo="algo_a",
        model="hf_toy",
        overrides=[f"model.path={hf_ckpt}", f"output_dir={tmp_path / 'runs'}", "trainer.max_prompt_length=4096"],
    )
    task = preflight_mod.preflight(dare, cfg, train=True)
    assert task.name == "sudoku" and LOADS == []
    assert preflight_mod.preflight(dare, cfg, prompts=["hi"]) is None
    _shards(hf_ckpt)  # a sharded checkpoint with every shard
    save_file({"embed": torch.zeros(100, 4)}, str(hf_ckpt / "model-00001-of-00002.safetensors"))
    save_file({"head": torch.zeros(4, 100)}, str(hf_ckpt / "model-00002-of-00002.safetensors"))
    assert preflight_mod._params(str(hf_ckpt)) == 800


def test_a_checkpoint_of_another_family_names_that_family(refused, tmp_path, hf_ckpt):
    (hf_ckpt / "config.json").write_text(json.dumps(dict(CONFIG, model_type="other_toy")))
    # its preset would not even resolve for hf_toy's sampler: the family is named first
    (hf_ckpt / "dare_defaults.yaml").write_text("common:\n  rollout: {gen_length: 7, block_length: 4}\n")
    message = refused(*_train(tmp_path, hf_ckpt))
    assert message == (
        f"{hf_ckpt} is a checkpoint of model_type 'other_toy', which model family 'hf_toy' "
        f"does not load; it is a 'other_toy' checkpoint: pass --model other_toy"
    )
    (hf_ckpt / "config.json").write_text(json.dumps(dict(CONFIG, model_type="nobody")))
    assert refused(*_train(tmp_path, hf_ckpt)).endswith("no installed model family loads it (`dare list models`)")
    assert refused(*_train(tmp_path, tmp_path / "nope")) == (
        f"model.path={tmp_path / 'nope'}: no such directory; give a checkpoint directory"
    )


@pytest.mark.parametrize("command", ["train", "generate"])
def test_a_prompt_beyond_the_context_is_refused(refused, tmp_path, hf_ckpt, command):
    (hf_ckpt / "config.json").write_text(json.dumps(dict(CONFIG, max_len=64)))
    args = COMMANDS[command](tmp_path, hf_ckpt)
    if command == "generate":
        args = ("generate", "--model", "hf_toy", "--prompt", "x" * 100, f"model.path={hf_ckpt}")
    message = refused(*args, "rollout.gen_length=32")
    fix = "give shorter prompts (fewer shots)" if command == "train" else "shorten the prompt"
    assert message.endswith(
        "tokens, which with rollout.gen_length=32 exceeds the model's context of 64 tokens (max_len in "
        f"config.json); {fix} or lower rollout.gen_length"
    )
    n = 729 if command == "train" else len("user: " + "x" * 100 + "\nassistant: ")  # the chat template's
    where = "task 'sudoku': " if command == "train" else ""
    assert message.startswith(f"{where}its longest prompt has {n} tokens")


def test_a_prompt_beyond_max_prompt_length_is_refused_before_the_run(refused, tmp_path, hf_ckpt):
    message = refused(*_train(tmp_path, hf_ckpt)[:-1])  # the default trainer.max_prompt_length
    assert message == (
        "task 'sudoku': a prompt has 729 tokens, more than trainer.max_prompt_length=512; "
        "raise trainer.max_prompt_length"
    )


def test_an_empty_prompt_is_refused(refused, hf_ckpt):
    assert (
        refused("generate", "--model", "hf_toy", "--prompt", "hi", "--prompt", " ", f"model.path={hf_ckpt}")
        == "--prompt is empty; give the text the model should respond to"
    )


def test_a_missing_data_file_is_refused_before_the_model(refused, tmp_path, ckpt):
    message = refused(
        "train",
        "--algo",
        "algo_a",
        "--model",
        "toy",
        f"model.path={ckpt}",
        f"output_dir={tmp_path / 'runs'}",
        f"task.eval_path={tmp_path / 'missing.jsonl'}",
    )
    assert message.startswith(f"data file not found: {tmp_path / 'missing.jsonl'}")


# ----------------------------------------------------------------------------- output directory
def test_a_read_only_output_dir_is_refused(refused, tmp_path, hf_ckpt, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    real = os.access  # root may write anyway: the check asks os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(parent) else real(p, mode, **kw))
    message = refused(*_train(tmp_path, hf_ckpt), f"output_dir={parent / 'runs'}")
    assert message == f"output_dir={parent / 'runs'}: {parent} is not writable; choose another output_dir"
    assert os.listdir(parent) == []


def test_an_output_dir_that_is_a_file_is_refused(refused, tmp_path, hf_ckpt):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "runs"):
        assert refused(*_train(tmp_path, hf_ckpt), f"output_dir={out}") == (
            f"output_dir={out}: {tmp_path / 'file'} is a file, not a directory; choose another output_dir"
        )


def test_too_little_free_space_is_refused(refused, tmp_path, hf_ckpt, monkeypatch, dare):
    cfg = resolve(
        dare,
        algo="algo_a",
        model="hf_toy",
        overrides=[f"model.path={hf_ckpt}", "trainer.steps=1000", "trainer.save_every=1", "trainer.keep_last=0"],
    )
    need = preflight_mod.disk_need(cfg, 800)
    assert need == 1000 * 800 * (4 + 12) + 800 * 4  # every checkpoint kept, the final model
    assert preflight_mod.disk_need(attrs_evolve(cfg, keep_last=2), 800) == 3 * 800 * 16 + 800 * 4
    usage = types.SimpleNamespace(total=10**12, used=0, free=need // 2)
    monkeypatch.setattr(preflight_mod.shutil, "disk_usage", lambda path: usage)
    message = refused(*_train(tmp_path, hf_ckpt), "trainer.steps=1000", "trainer.save_every=1")
    assert message == (
        f"output_dir={tmp_path / 'runs'}: the run's saves need about 12.8 MB, {tmp_path} has "
        f"6.4 MB free; free space, choose another output_dir or save less (trainer.keep_last, "
        f"trainer.save_every, trainer.save_final)"
    )
    usage.free = need
    cfg = resolve(
        dare,
        algo="algo_a",
        model="hf_toy",
        overrides=[
            f"model.path={hf_ckpt}",
            f"output_dir={tmp_path / 'runs'}",
            "trainer.max_prompt_length=4096",
            "trainer.steps=1000",
            "trainer.save_every=1",
        ],
    )
    preflight_mod.preflight(dare, cfg, train=True)  # exactly enough


def attrs_evolve(cfg, **trainer):
    return attrs.evolve(cfg, trainer=attrs.evolve(cfg.trainer, **trainer))


# ----------------------------------------------------------------------------- semantic checks
def test_an_empty_model_path_is_refused(refused, tmp_path):
    assert refused("train", "--algo", "algo_a", "--model", "toy", "model.path=") == (
        "invalid configuration: model.path is empty; omit it to use the bundled checkpoint or give a directory"
    )


@attrs.frozen
class _NoOptions:
    """An algorithm without options."""


def test_one_rollout_per_group_is_refused_for_a_grouped_advantage(refused, make_dare, make_plugin, ckpt):
    assert refused("train", "--algo", "algo_a", "--model", "toy", f"model.path={ckpt}", "trainer.group_size=1") == (
        "invalid configuration: trainer.group_size=1: algorithm 'algo_a' compares the rollouts of each prompt "
        "(advantage 'group_norm'); set trainer.group_size to 2 or more"
    )
    # an advantage estimator that does not declare needs_groups takes one rollout per prompt
    d = make_dare(
        make_plugin(
            "plain",
            dare_register_algorithms=lambda register: register(
                AlgorithmSpec(
                    name="algo_plain",
                    workflow="rl",
                    config_cls=_NoOptions,
                    build=lambda cfg, lookup: None,
                    components={"advantage": "test_advantage"},
                )
            ),
        )
    )
    assert [d.registries.advantages.get(n).needs_groups for n in ("group_norm", "rloo", "test_advantage")] == [
        True,
        True,
        False,
    ]
    cfg = resolve(d, algo="algo_plain", model="toy", overrides=[f"model.path={ckpt}", "trainer.group_size=1"])
    assert cfg.trainer.group_size == 1


def test_an_eval_backend_the_family_does_not_list_is_refused(refused, ckpt):
    assert refused("generate", "--model", "toy", "--prompt", "hi", f"model.path={ckpt}", "eval.backend=mini") == (
        "invalid configuration: eval.backend 'mini' is not a backend model family 'toy' lists; "
        "use one of: low_confidence"
    )


# ----------------------------------------------------------------------------- hub checkpoints
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, hf_ckpt, monkeypatch):
    """A Hugging Face cache holding the ``hf_toy`` checkpoint as the repository ``test-org/tiny``
    (its ``main`` branch and commit :data:`COMMIT`), read offline (``HF_HUB_OFFLINE=1``)."""
    import shutil

    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--test-org--tiny"
    shutil.copytree(hf_ckpt, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo / "snapshots" / COMMIT


def test_a_hub_id_resolves_to_its_cached_snapshot(dare, hub_cache):
    """``model.path=owner/name`` (and ``@revision``) is the snapshot directory in the cache, once,
    in config resolution: the resolved config names the directory the run reads."""
    for path in ("test-org/tiny", f"test-org/tiny@{COMMIT}"):
        cfg = resolve(dare, algo="algo_a", model="hf_toy", overrides=[f"model.path={path}"])
        assert cfg.model.path == str(hub_cache)


def test_a_hub_id_offline_and_not_cached_is_one_line(refused, tmp_path, hub_cache):
    message = refused(*_train(tmp_path, "test-org/absent"))
    assert message.startswith(
        "model.path=test-org/absent: not a directory, and the hub checkpoint 'test-org/absent' is not "
        "in the Hugging Face cache ("
    )
    assert message.endswith(
        "with HF_HUB_OFFLINE=1; download it where there is a network (huggingface-cli download "
        "test-org/absent) or give a checkpoint directory"
    )
    assert "at revision 'v9'" in refused(*_train(tmp_path, "test-org/tiny@v9"))


@pytest.mark.parametrize(
    ("saved", "given", "resolved"),
    [
        ({"dtype": "bfloat16"}, None, "bfloat16"),  # model.dtype=auto (the default): the checkpoint's
        ({"torch_dtype": "float16"}, None, "float16"),  # the older transformers key
        ({}, None, "float32"),  # a config.json naming none
        ({"dtype": "bfloat16"}, "float32", "float32"),  # a dtype given wins
    ],
)
def test_model_dtype_auto_is_the_checkpoints(dare, hf_ckpt, saved, given, resolved):
    (hf_ckpt / "config.json").write_text(json.dumps({**CONFIG, **saved}))
    over = [f"model.path={hf_ckpt}", *([f"model.dtype={given}"] if given else [])]
    assert resolve(dare, algo="algo_a", model="hf_toy", overrides=over).model.dtype == resolved
