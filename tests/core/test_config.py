"""Run configuration: structure, overrides, errors, layering, capabilities, help, round trip."""

from __future__ import annotations

from typing import Optional

import attrs
import pytest
import yaml

from dare_core.config import (
    EngineConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainerConfig,
    render_with_help,
    resolve,
    structure,
    structure_or_raise,
    to_dict,
)
from dare_core.config.loader import PRESET_FILE, RESOLVED, deep_merge, load_yaml, parse_overrides
from dare_core.config.structure import unstructure
from dare_core.config.validators import positive
from dare_core.errors import CapabilityError, ConfigError, DareError, UnknownNameError
from dare_core.rundir import RunDir
from dare_plugin_samplers.low_confidence import LowConfidenceConfig


def _write(path, data) -> str:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def _resolve(dare, ckpt, *overrides, algo="algo_a", model="toy", **kw):
    return resolve(dare, algo=algo, model=model, overrides=(f"model.path={ckpt}", *overrides), **kw)


def _problems(exc_info) -> list[str]:
    assert "\n" not in str(exc_info.value)
    return exc_info.value.problems


# ----------------------------------------------------------------------------- schema defaults
def test_defaults_structure_to_the_default_config():
    cfg, problems = structure(RunConfig, {})
    assert problems == []
    assert cfg == RunConfig()
    assert isinstance(cfg.trainer, TrainerConfig) and isinstance(cfg.task, TaskConfig)


@pytest.mark.parametrize(
    "cls", [RunConfig, ModelConfig, TrainerConfig, EvalConfig, EngineConfig, TaskConfig, LowConfidenceConfig]
)
def test_every_core_config_field_has_help_and_is_frozen(cls):
    for f in attrs.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(cls(), attrs.fields(cls)[0].name, None)


def test_structure_collects_nested_problems_with_dotted_paths():
    _, problems = structure(RunConfig, {"trainer": {"lr": "fast", "stepz": 1}, "eval": 3})
    assert "trainer.lr: expected float, got 'fast'" in problems
    assert any(p.startswith("trainer.stepz: unknown key (did you mean 'steps'?)") for p in problems)
    assert "eval: expected a mapping, got 3" in problems
    with pytest.raises(ConfigError) as info:
        structure_or_raise(RunConfig, {"seed": "x"})
    assert info.value.problems == ["seed: expected int, got 'x'"]


def test_structure_is_strict_about_types():
    _, problems = structure(TrainerConfig, {"steps": True, "lr": False, "save_final": "maybe"})
    assert len(problems) == 3
    cfg, problems = structure(TrainerConfig, {"steps": 4.0, "lr": "1e-4", "save_final": "false"})
    assert problems == [] and (cfg.steps, cfg.lr, cfg.save_final) == (4, 1e-4, False)
    cfg, problems = structure(RunConfig, {"run_name": 2024})
    assert problems == [] and cfg.run_name == "2024"
    _, problems = structure(ModelConfig, {"dtype": "float64"})
    assert problems == ["dtype: expected one of 'auto', 'float32', 'bfloat16', 'float16', got 'float64'"]


def test_unknown_key_without_close_match_lists_the_valid_keys():
    _, problems = structure(EngineConfig, {"zzzz": 1})
    assert problems == ["zzzz: unknown key (valid keys: bf16_update, name, precision, timeout)"]


def test_validators_may_read_other_fields_and_defaults_are_checked():
    @attrs.frozen
    class Bounds:
        low: int = attrs.field(default=0, metadata={"help": "low"})
        high: int = attrs.field(default=10, metadata={"help": "high"})
        name: Optional[str] = attrs.field(default=None, metadata={"help": "name"})

        @high.validator
        def _above_low(self, attribute, value):
            if value < self.low:
                raise ValueError(f"must be >= low ({self.low}), got {value}")

    assert structure(Bounds, {"low": 3, "high": 5})[0] == Bounds(3, 5)
    # the invalid value is the *default* of `high`, caused by the given `low`
    assert structure(Bounds, {"low": 20})[1] == ["high: must be >= low (20), got 10"]
    # a broken field does not crash a validator that reads it, and other problems still show
    assert structure(Bounds, {"low": "x", "name": []})[1] == [
        "low: expected int, got 'x'",
        "name: expected str or null, got []",
    ]


def test_required_fields_are_reported():
    @attrs.frozen
    class Needs:
        must: int = attrs.field(metadata={"help": "required"})

    assert structure(Needs, {})[1] == ["must: missing required key"]


def test_unstructure_gives_plain_yaml_data():
    data = unstructure(RunConfig(algorithm={"k": (1, 2)}))
    assert data["algorithm"] == {"k": [1, 2]}
    assert data["trainer"]["lr"] == TrainerConfig().lr
    assert unstructure(frozenset({"b", "a"})) == ["a", "b"]
    yaml.safe_dump(data)


# ----------------------------------------------------------------------------- overrides
def test_parse_overrides_nested_and_yaml_typed():
    data, problems = parse_overrides(
        [
            "trainer.lr=1e-4",
            "trainer.steps=5",
            "eval.before=false",
            "model.path=null",
            "run_name=my run",
            "a.b.c=[1, 2]",
            "x=y=z",
            "s='007'",
            "empty=",
        ]
    )
    assert problems == []
    assert data == {
        "trainer": {"lr": "1e-4", "steps": 5},  # YAML 1.1 reads 1e-4 as a string ...
        "eval": {"before": False},
        "model": {"path": None},
        "run_name": "my run",
        "a": {"b": {"c": [1, 2]}},
        "x": "y=z",
        "s": "007",
        "empty": "",
    }


def test_parse_overrides_bad_syntax():
    _, problems = parse_overrides(["trainer.lr", "=3", "a..b=1", "ok=1"])
    assert len(problems) == 3
    assert "expected key=value" in problems[0]
    assert all("empty key" in p for p in problems[1:])


def test_override_string_float_becomes_float(dare, ckpt):
    cfg = _resolve(dare, ckpt, "trainer.lr=1e-4", "algorithm.clip_ratio_low=2e-1")
    assert cfg.trainer.lr == pytest.approx(1e-4) and isinstance(cfg.trainer.lr, float)
    assert cfg.algorithm.clip_ratio_low == pytest.approx(0.2)


def test_bad_override_syntax_is_a_config_error(dare, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "trainer.steps", "trainer.lr=-1")
    problems = _problems(info)
    assert any("'trainer.steps': expected key=value" in p for p in problems)
    assert "trainer.lr: must be > 0, got -1.0" in problems


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1, "c": 2}}
    out = deep_merge(base, {"a": {"b": 3}, "d": 4})
    assert out == {"a": {"b": 3, "c": 2}, "d": 4} and base == {"a": {"b": 1, "c": 2}}


# ----------------------------------------------------------------------------- resolve
def test_resolve_structures_algorithm_and_rollout_sections(dare, ckpt, load_calls):
    cfg = _resolve(dare, ckpt)
    spec = dare.registries.algorithms.get("algo_a")
    assert isinstance(cfg.algorithm, spec.config_cls) and cfg.algorithm == spec.config_cls()
    assert isinstance(cfg.rollout, LowConfidenceConfig)
    assert cfg.rollout_backend == "low_confidence"  # the family's default
    assert (cfg.algo, cfg.model.family, cfg.model.path) == ("algo_a", "toy", str(ckpt))
    assert cfg.trainer.lr == 1e-4 and cfg.trainer.steps == 3  # the algorithm's recipe
    assert load_calls == []
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.seed = 3


def test_one_yaml_file_with_several_problems_gives_one_error(dare, ckpt, tmp_path):
    path = _write(
        tmp_path / "run.yaml",
        {
            "trainr": {"steps": 2},  # bad key
            "trainer": {"steps": "many", "lr": -0.5},  # wrong type, bad value
        },
    )
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, config_file=path)
    problems = _problems(info)
    assert problems == [
        "trainr: unknown key (did you mean 'trainer'?)",
        "trainer.steps: expected int, got 'many'",
        "trainer.lr: must be > 0, got -0.5",
    ]
    assert str(info.value).startswith("invalid configuration (3 problems): ")


def test_problems_of_every_section_are_reported_together(dare, ckpt, tmp_path):
    path = _write(
        tmp_path / "run.yaml",
        {
            "seed": "abc",
            "task": {"name": "no_such_task"},
            "algorithm": {"clip_ratio_lo": 0.1, "agg": "sum"},
            "rollout": {"gen_length": 0, "temprature": 1.0},
        },
    )
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, config_file=path)
    problems = _problems(info)
    assert "seed: expected int, got 'abc'" in problems
    assert "algorithm.clip_ratio_lo: unknown key (did you mean 'clip_ratio_low'?)" in problems
    assert any(p.startswith("algorithm.agg: expected one of 'token-mean'") for p in problems)
    assert any(p.startswith("rollout.gen_length: must be > 0") for p in problems)
    assert "rollout.temprature: unknown key (did you mean 'temperature'?)" in problems
    assert len(problems) == 5


def test_unknown_task_is_reported_with_other_problems(dare, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "task.name=sudok", "algorithm.nope=1")
    problems = _problems(info)
    assert any(p.startswith("algorithm.nope: unknown key") for p in problems)
    task = [p for p in problems if p.startswith("task.name:")]
    assert len(task) == 1
    assert "unknown task 'sudok'" in task[0] and "echo_task" in task[0] and "'sudoku'" in task[0]


def test_unknown_key_in_the_algorithm_section(dare, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "algorithm.mc_numm=2")
    assert _problems(info) == ["algorithm.mc_numm: unknown key (did you mean 'mc_num'?)"]


def test_algorithm_options_without_algorithm(dare, ckpt):
    with pytest.raises(ConfigError, match="no algorithm selected"):
        resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={ckpt}", "algorithm.x=1"])


def test_non_mapping_sections_are_reported_once(dare, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "rollout=5", "algorithm=[1]")
    assert _problems(info) == ["rollout: expected a mapping, got 5", "algorithm: expected a mapping, got [1]"]


def test_cross_field_invariants_are_reported(dare, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "algorithm.stages=[3, 1]")
    assert _problems(info) == ["algorithm: stages must be increasing, got [3, 1]"]
    with pytest.raises(ConfigError) as info:  # a validator reading another field
        _resolve(dare, ckpt, "algorithm.mc_num=3", "algorithm.max_mc=2")
    assert _problems(info) == ["algorithm.mc_num: must be <= max_mc (2), got 3"]
    with pytest.raises(ConfigError) as info:  # the rollout backend's own __attrs_post_init__
        _resolve(dare, ckpt, "rollout.gen_length=10", "rollout.block_length=4")
    (problem,) = _problems(info)
    assert problem.startswith("rollout: ") and "block_length" in problem


def test_layering_recipe_preset_file_overrides(dare, ckpt, tmp_path):
    (ckpt / PRESET_FILE).write_text(
        yaml.safe_dump(
            {
                "common": {
                    "trainer": {"steps": 5, "batch_size": 6, "micro_batch_size": 2},
                    "rollout": {
                        "gen_length": 16,
                        "block_length": 16,
                        "steps": 8,
                        "not_a_field": 1,
                        "backend": "ignored",
                    },
                    "eval": {"before": False},
                    "algorithm": {"mc_num": 4},  # below the file, whatever the preset may set
                },
                "rl": {"trainer": {"batch_size": 7, "group_size": 3}},
                "sft": {"trainer": {"group_size": 99, "lr": 0.5}},
            }
        )
    )
    path = _write(tmp_path / "run.yaml", {"trainer": {"group_size": 4, "ppo_epochs": 2}, "algorithm": {"mc_num": 2}})
    cfg = _resolve(dare, ckpt, "trainer.ppo_epochs=3", config_file=path)
    t = cfg.trainer
    assert t.lr == 1e-4  # recipe
    assert t.steps == 5  # preset common > recipe (3)
    assert t.micro_batch_size == 2  # preset common
    assert t.batch_size == 7  # preset rl section > common (6) > recipe (4)
    assert t.group_size == 4  # file > preset rl (3) > recipe (2); the sft section unused
    assert t.ppo_epochs == 3  # override > file (2)
    assert cfg.eval.before is False
    assert cfg.algorithm.mc_num == 2
    assert (cfg.rollout.gen_length, cfg.rollout.block_length, cfg.rollout.steps) == (16, 16, 8)
    assert cfg.rollout_backend == "low_confidence"
    # the preset's rollout keys apply only where the chosen backend has them
    mini = _resolve(dare, ckpt, "rollout.backend=mini")
    assert mini.rollout_backend == "mini"
    assert (mini.rollout.gen_length, mini.rollout.steps) == (16, 8)
    # the workflow section follows the algorithm's workflow
    assert _resolve(dare, ckpt, algo="algo_sft").trainer.group_size == 99
    # generate / eval (no algorithm): the common section only
    plain = resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={ckpt}"])
    assert plain.trainer.batch_size == 6 and plain.trainer.lr == TrainerConfig().lr
    assert plain.algorithm == {} and plain.algo == ""


def test_a_preset_with_invalid_yaml_is_an_error(dare, ckpt):
    (ckpt / PRESET_FILE).write_text("common: [unclosed\n")
    with pytest.raises(DareError, match="not valid YAML"):
        _resolve(dare, ckpt)


def test_cli_names_win_over_the_file(dare, ckpt, tmp_path):
    path = _write(tmp_path / "run.yaml", {"algo": "algo_sft", "model": {"family": "toy_block"}})
    cfg = _resolve(dare, ckpt, config_file=path)
    assert (cfg.algo, cfg.model.family) == ("algo_a", "toy")
    cfg = resolve(dare, config_file=path, overrides=[f"model.path={ckpt}", "algo=algo_a", "model.family=toy"])
    assert (cfg.algo, cfg.model.family) == ("algo_a", "toy")


# ----------------------------------------------------------------------------- names
def test_unknown_algorithm_model_rollout_task(dare, ckpt):
    with pytest.raises(UnknownNameError) as info:
        _resolve(dare, ckpt, algo="algo_x")
    assert "unknown algorithm 'algo_x'" in str(info.value) and "did you mean 'algo_a'?" in str(info.value)
    assert "pip install dare-plugin-algo-x" in str(info.value)
    with pytest.raises(UnknownNameError, match="unknown model 'tyo'.*did you mean 'toy'.*dare-plugin-tyo"):
        _resolve(dare, ckpt, model="tyo")
    with pytest.raises(UnknownNameError, match="unknown rollout backend 'minu'.*did you mean 'mini'") as info:
        _resolve(dare, ckpt, "rollout.backend=minu")
    # a backend is no plugin of its own: the hint names the first-party samplers, not dare-plugin-minu
    assert "dare-plugin-minu" not in str(info.value)
    assert "pip install dare-plugin-samplers" in str(info.value)
    with pytest.raises(ConfigError, match="task.name: unknown task 'echo'"):
        _resolve(dare, ckpt, "task.name=echo")
    assert _resolve(dare, ckpt, "task.name=echo_task").task.name == "echo_task"


def test_missing_names_and_checkpoint(dare, ckpt):
    with pytest.raises(DareError, match="no algorithm given"):
        resolve(dare, model="toy")
    with pytest.raises(DareError, match="no model family given"):
        resolve(dare, algo="algo_a")
    with pytest.raises(DareError, match="ships no bundled checkpoint; pass model.path"):
        resolve(dare, algo="algo_a", model="toy")


def test_workflow_mismatch(dare, ckpt):
    with pytest.raises(DareError, match="runs the rl workflow, not sft"):
        _resolve(dare, ckpt, workflow="sft")
    assert _resolve(dare, ckpt, workflow="rl").algo == "algo_a"


def test_config_file_errors(dare, ckpt, tmp_path):
    with pytest.raises(DareError, match="does not exist"):
        _resolve(dare, ckpt, config_file=str(tmp_path / "missing.yaml"))
    with pytest.raises(DareError, match="not valid YAML at line 2"):
        load_yaml(_write(tmp_path / "bad.yaml", "a: 1\n- 2\n"))
    with pytest.raises(DareError, match="mapping at the top level, got list"):
        load_yaml(_write(tmp_path / "list.yaml", "- 1\n"))
    assert load_yaml(_write(tmp_path / "empty.yaml", "")) == {}


# ----------------------------------------------------------------------------- capabilities
@pytest.mark.parametrize(
    "algo,model,overrides,needle",
    [
        ("algo_block", "toy", (), "does not support masked-diffusion models such as 'toy'"),
        ("algo_cache", "toy", (), "needs model capability kv_cache which 'toy' lacks"),
        ("algo_a", "toy_block", ("rollout.backend=block_only",), "does not support block-diffusion"),
        ("algo_a", "toy", ("rollout.backend=block_only",), "does not support masked-diffusion models such as 'toy'"),
        ("algo_a", "toy", ("rollout.backend=cached",), "needs model capability kv_cache"),
    ],
)
def test_capability_errors_come_before_any_model_load(dare, ckpt, load_calls, algo, model, overrides, needle):
    with pytest.raises(CapabilityError) as info:
        _resolve(dare, ckpt, *overrides, algo=algo, model=model)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert load_calls == []


def test_supported_capability_combinations_resolve(dare, ckpt, load_calls):
    cfg = _resolve(dare, ckpt, "rollout.backend=cached", algo="algo_cache", model="toy_cached")
    assert cfg.rollout_backend == "cached" and cfg.rollout.gen_length == 64
    assert load_calls == []


# ----------------------------------------------------------------------------- help and round trip
def _help_texts(cls) -> list[str]:
    out = []
    for f in attrs.fields(cls):
        if f.name in (*RESOLVED, "sections"):  # resolved, not keys; sections: only when a plugin owns one
            continue
        out.append(f.metadata["help"])
        if attrs.has(f.type) if isinstance(f.type, type) else False:
            out += _help_texts(f.type)
    return out


def test_render_with_help_contains_every_fields_help(dare, ckpt):
    cfg = _resolve(dare, ckpt, "trainer.steps=9")
    text = render_with_help(cfg)
    attrs.resolve_types(RunConfig)
    for cls in (RunConfig, type(cfg.algorithm), type(cfg.rollout)):
        for help_text in _help_texts(cls):
            assert f"# {help_text}" in text, help_text
    assert "  backend: low_confidence  # Rollout backend." in text
    assert not [key for key in RESOLVED if key in text]
    assert "  steps: 9  # " in text
    assert "  tags: [x]  # " in text
    assert yaml.safe_load(text)["trainer"]["steps"] == 9  # comments aside, it is YAML


def test_to_dict_round_trips_through_resolve(dare, ckpt, tmp_path):
    cfg = _resolve(
        dare,
        ckpt,
        "rollout.backend=mini",
        "rollout.gen_length=12",
        "trainer.lr=3e-5",
        "algorithm.tags=[b, a]",
        "algorithm.stages=[1, 5, 9]",
        "task.name=countdown",
        "run_name=again",
    )
    data = to_dict(cfg)
    assert data["rollout"]["backend"] == "mini" and "rollout_backend" not in data
    assert data["algorithm"]["tags"] == ["a", "b"] and data["algorithm"]["stages"] == [1, 5, 9]
    run = RunDir(str(tmp_path / "run"))
    run.write_config(data)
    again = resolve(dare, config_file=run.path("config.yaml"))  # names come from the file
    assert again == cfg
    assert again.algorithm.tags == frozenset({"a", "b"}) and again.algorithm.stages == (1, 5, 9)


def test_to_dict_round_trips_without_algorithm(dare, ckpt, tmp_path):
    cfg = resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={ckpt}"])
    path = _write(tmp_path / "c.yaml", to_dict(cfg))
    assert resolve(dare, config_file=path, need_algo=False) == cfg


class _NeedsBackendFeatures:
    """A family whose default backend ('mini') lacks block_length and continue_from, and
    algorithms whose training rollout needs them."""

    @staticmethod
    def _build(cfg, lookup):
        from dare_core.components.estimators import ResponseTokenLogProb
        from dare_core.components.losses import ClippedPolicyLoss
        from dare_core.interfaces import RLComponents

        return RLComponents(estimator=ResponseTokenLogProb(), loss=ClippedPolicyLoss())

    from dare_core import hookimpl as _hookimpl

    @_hookimpl
    def dare_register_model_wrappers(self, register):
        from dare_core.interfaces import ModelFamily

        register(
            ModelFamily(
                name="toy_mini",
                kind="masked",
                load=lambda *a, **k: None,
                capabilities=frozenset({"mask_token", "absorbing_elbo"}),
                default_rollout="mini",
                rollouts=("mini", "low_confidence"),
                description="family whose default backend is 'mini'",
            )
        )

    @_hookimpl
    def dare_register_algorithms(self, register):
        from dare_core.interfaces import AlgorithmSpec, RolloutNeeds

        @attrs.frozen
        class Empty:
            pass

        for name, fields, methods in (
            ("needs_plain", frozenset(), frozenset()),
            ("needs_field", frozenset({"block_length"}), frozenset()),
            ("needs_method", frozenset(), frozenset({"continue_from"})),
        ):
            register(
                AlgorithmSpec(
                    name=name,
                    workflow="rl",
                    config_cls=Empty,
                    build=self._build,
                    rollout=RolloutNeeds(fields=fields, methods=methods),
                    description=name,
                )
            )


@pytest.mark.parametrize(
    "algo,backend", [("needs_plain", "mini"), ("needs_field", "low_confidence"), ("needs_method", "low_confidence")]
)
def test_default_backend_offers_the_fields_and_methods_the_training_rollout_needs(make_dare, ckpt, algo, backend):
    dare = make_dare(_NeedsBackendFeatures())
    cfg = _resolve(dare, ckpt, algo=algo, model="toy_mini")
    assert cfg.rollout_backend == backend
    # an explicit backend is never replaced
    cfg = _resolve(dare, ckpt, "rollout.backend=mini", algo=algo, model="toy_mini")
    assert cfg.rollout_backend == "mini"


def test_preset_suggests_a_rollout_backend_that_yields_to_the_algorithm_needs(make_dare, ckpt):
    dare = make_dare(_NeedsBackendFeatures())
    (ckpt / PRESET_FILE).write_text(
        yaml.safe_dump(
            {
                "common": {"rollout": {"gen_length": 16, "block_length": 16, "steps": 8}},
                "rl": {"rollout": {"backend": "mini"}},
            }
        )
    )
    assert _resolve(dare, ckpt, algo="needs_plain").rollout_backend == "mini"
    # mini has no block_length: the suggestion is passed over for a backend that has it
    assert _resolve(dare, ckpt, algo="needs_field").rollout_backend == "low_confidence"
    # an explicit choice wins; a suggestion that is not installed is ignored
    assert (
        _resolve(dare, ckpt, "rollout.backend=low_confidence", algo="needs_plain").rollout_backend == "low_confidence"
    )
    (ckpt / PRESET_FILE).write_text(yaml.safe_dump({"rl": {"rollout": {"backend": "not_installed"}}}))
    assert _resolve(dare, ckpt, algo="needs_plain").rollout_backend == "low_confidence"
    # a suggestion that cannot drive the family (block-only backend on a masked family) is ignored
    (ckpt / PRESET_FILE).write_text(yaml.safe_dump({"rl": {"rollout": {"backend": "block_only"}}}))
    assert _resolve(dare, ckpt, algo="needs_plain").rollout_backend == "low_confidence"


def test_preset_algorithm_sections_apply_to_that_algorithm_only(dare, ckpt):
    (ckpt / PRESET_FILE).write_text(
        yaml.safe_dump(
            {
                "rl": {"trainer": {"lr": 0.125, "steps": 9}},
                "algorithms": {"algo_a": {"trainer": {"lr": 0.25}}, "algo_sft": {"trainer": {"lr": 0.5}}},
            }
        )
    )
    cfg = _resolve(dare, ckpt)  # algo_a
    assert cfg.trainer.lr == 0.25 and cfg.trainer.steps == 9
    assert _resolve(dare, ckpt, "trainer.lr=0.75").trainer.lr == 0.75  # overrides still win
    assert _resolve(dare, ckpt, algo="algo_sft").trainer.lr == 0.5
    plain = resolve(dare, model="toy", need_algo=False, overrides=[f"model.path={ckpt}"])
    assert plain.trainer.lr == TrainerConfig().lr


def test_eval_backend_is_checked_and_shares_the_rollout_fields(make_dare, ckpt):
    from dare_core.workflows.runtime import eval_backend_name

    dare = make_dare(_NeedsBackendFeatures())
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "eval.backend=mnii")
    (problem,) = _problems(info)
    assert problem.startswith("eval.backend: ") and "mini" in problem
    with pytest.raises(ConfigError) as info:
        _resolve(dare, ckpt, "eval.backend=block_only")
    assert "block" in _problems(info)[0]
    with pytest.raises(ConfigError) as info:  # drives masked models, but 'toy' does not list it
        _resolve(dare, ckpt, "eval.backend=mini")
    assert _problems(info) == [
        "eval.backend 'mini' is not a backend model family 'toy' lists; use one of: low_confidence"
    ]
    cfg = _resolve(
        dare,
        ckpt,
        "eval.backend=mini",
        "rollout.backend=low_confidence",
        "rollout.gen_length=24",
        "rollout.block_length=8",
        "rollout.steps=12",
        "rollout.temperature=0.7",
        "eval.steps=6",
        model="toy_mini",
    )
    assert cfg.rollout_backend == "low_confidence" and eval_backend_name(cfg) == "mini"
    ev = cfg.eval_rollout
    assert type(ev).__name__ == "MiniRolloutConfig"
    assert (ev.gen_length, ev.steps, ev.temperature) == (24, 6, 0.0)
    same = _resolve(dare, ckpt, "rollout.steps=16")
    assert eval_backend_name(same) == "low_confidence"
    assert same.eval_rollout.steps == same.rollout.gen_length  # eval.steps null: one token per step


def test_the_eval_backend_takes_the_presets_rollout_keys_the_training_backend_lacks(make_dare, ckpt):
    """A preset's ``rollout.block_length`` reaches an evaluation backend that has the field when
    the training backend has none (the Dream checkpoint's ``dream_generate`` with
    ``eval.backend=fast``), so gen_length and block_length agree as the preset sets them."""
    dare = make_dare(_NeedsBackendFeatures())
    (ckpt / PRESET_FILE).write_text(
        yaml.safe_dump({"common": {"rollout": {"gen_length": 24, "block_length": 24, "steps": 12}}})
    )
    cfg = _resolve(dare, ckpt, "rollout.backend=mini", "eval.backend=low_confidence", model="toy_mini")
    assert not hasattr(cfg.rollout, "block_length") and cfg.rollout.gen_length == 24
    assert (cfg.eval_rollout.gen_length, cfg.eval_rollout.block_length) == (24, 24)


# ----------------------------------------------------------------------------- plugin-owned sections
@attrs.frozen
class SinkConfig:
    """Where the test observer writes."""

    path: Optional[str] = attrs.field(default=None, metadata={"help": "Output file; null = none."})


@attrs.frozen
class ObserverConfig:
    """Options of a test observer plugin."""

    level: int = attrs.field(default=1, metadata={"help": "Verbosity level."}, validator=positive)
    names: tuple[str, ...] = attrs.field(default=(), metadata={"help": "Metric names to watch."})
    sink: SinkConfig = attrs.field(factory=SinkConfig, metadata={"help": "Output of the observer."})


def _sections(make_dare, make_plugin, *sections):
    """A Dare whose plugin ``test_sections`` registers ``sections`` (ConfigSection objects)."""

    def register_sections(register):
        for sec in sections:
            register(sec)

    return make_dare(make_plugin("test_sections", dare_register_config_sections=register_sections))


@pytest.fixture
def observed(make_dare, make_plugin):
    from dare_core.interfaces import ConfigSection

    return _sections(make_dare, make_plugin, ConfigSection("observer", ObserverConfig, "A test observer's options."))


def test_a_plugin_section_not_given_holds_its_defaults(observed, ckpt):
    cfg = _resolve(observed, ckpt)
    assert cfg.sections == {"observer": ObserverConfig()}
    assert cfg.plugin_section("observer") is cfg.sections["observer"]
    data = to_dict(cfg)
    assert data["observer"] == {"level": 1, "names": [], "sink": {"path": None}}
    assert "sections" not in data and list(data)[-1] == "observer"


def test_without_a_plugin_section_nothing_changes(dare, ckpt):
    cfg = _resolve(dare, ckpt)
    assert cfg.sections == {} and "sections" not in to_dict(cfg)


def test_a_plugin_section_is_structured_from_the_file_and_overrides(observed, ckpt, tmp_path):
    path = _write(
        tmp_path / "run.yaml", {"observer": {"names": ["loss"], "sink": {"path": "x.log"}}, "trainer": {"steps": 4}}
    )
    cfg = _resolve(observed, ckpt, "observer.level=3", "observer.sink.path=y.log", config_file=path)
    assert cfg.plugin_section("observer") == ObserverConfig(3, ("loss",), SinkConfig("y.log"))
    assert cfg.trainer.steps == 4


def test_plugin_section_problems_are_reported_with_the_others(observed, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(
            observed,
            ckpt,
            "observer.levle=2",
            "observer.level=0",
            "observer.sink.pth=a",
            "observer.names=3",
            "trainer.stepz=1",
            "algorithm.mc_numm=2",
        )
    problems = _problems(info)
    assert problems == [
        "trainer.stepz: unknown key (did you mean 'steps'?)",
        "algorithm.mc_numm: unknown key (did you mean 'mc_num'?)",
        "observer.levle: unknown key (did you mean 'level'?)",
        "observer.names: expected tuple[str, ...], got 3",
        "observer.sink.pth: unknown key (did you mean 'path'?)",
        "observer.level: must be > 0, got 0",
    ]
    with pytest.raises(ConfigError) as info:
        _resolve(observed, ckpt, "observer=3")
    assert _problems(info) == ["observer: expected a mapping, got 3"]


def test_unknown_top_level_keys_offer_the_plugin_sections(observed, dare, ckpt):
    with pytest.raises(ConfigError) as info:
        _resolve(observed, ckpt, "observr.level=2")
    assert _problems(info) == ["observr: unknown key (did you mean 'observer'?)"]
    with pytest.raises(ConfigError) as info:
        _resolve(observed, ckpt, "zzzz=1")
    (problem,) = _problems(info)
    assert problem.startswith("zzzz: unknown key (valid keys: ") and "observer" in problem
    assert "eval" in problem and "trainer" in problem
    with pytest.raises(ConfigError) as info:  # without the plugin, its section is unknown
        _resolve(dare, ckpt, "observer.level=2")
    assert _problems(info)[0].startswith("observer: unknown key")
    with pytest.raises(ConfigError) as info:  # the holder field is not a key of the file
        _resolve(observed, ckpt, "sections.observer.level=2")
    assert _problems(info) == [
        "sections: not a config key; plugin-owned sections are top-level keys (installed: observer)"
    ]


def test_a_plugin_section_round_trips_through_config_yaml(observed, ckpt, tmp_path):
    cfg = _resolve(observed, ckpt, "observer.names=[b, a]", "observer.sink.path=z")
    run = RunDir(str(tmp_path / "run"))
    run.write_config(to_dict(cfg))
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert written["observer"] == {"level": 1, "names": ["b", "a"], "sink": {"path": "z"}}
    again = resolve(observed, config_file=run.path("config.yaml"))
    assert again == cfg and again.plugin_section("observer").names == ("b", "a")


def test_render_with_help_shows_plugin_sections_as_top_level_keys(observed, ckpt):
    cfg = _resolve(observed, ckpt, "observer.level=5")
    text = render_with_help(cfg, observed)
    assert "\nobserver:  # A test observer's options.\n" in text
    for help_text in _help_texts(ObserverConfig):
        assert f"# {help_text}" in text, help_text
    assert "  level: 5  # Verbosity level." in text and "  sink:  # Output of the observer." in text
    assert "    path: null  # Output file; null = none." in text
    assert "# " + attrs.fields(RunConfig).sections.metadata["help"] in text
    assert "sections:" not in text
    assert yaml.safe_load(text)["observer"]["level"] == 5
    # without the registry, the header is the class docstring's first line
    assert "\nobserver:  # Options of a test observer plugin.\n" in render_with_help(cfg)
    # no plugin section: no header either
    assert "Plugin-owned" not in render_with_help(attrs.evolve(cfg, sections={}))


def test_plugin_section_accessor(observed, ckpt):
    cfg = _resolve(observed, ckpt)
    assert cfg.plugin_section("observer", ObserverConfig) is cfg.sections["observer"]
    assert RunConfig().plugin_section("observer", ObserverConfig) == ObserverConfig()
    with pytest.raises(DareError, match="no section 'observer' .*has: none.*installed"):
        RunConfig().plugin_section("observer")


def test_a_plugin_section_may_not_take_a_core_key_or_a_non_attrs_class(make_dare, make_plugin, ckpt):
    from dare_core.interfaces import ConfigSection

    taken = _sections(make_dare, make_plugin, ConfigSection("trainer", ObserverConfig))
    with pytest.raises(
        DareError,
        match="plugin 'test_sections' registers the config section 'trainer'.*DARE_DISABLE_PLUGINS=test_sections",
    ):
        _resolve(taken, ckpt)
    bad = _sections(make_dare, make_plugin, ConfigSection("observer", dict))
    with pytest.raises(TypeError, match="needs an attrs class"):
        _resolve(bad, ckpt)
