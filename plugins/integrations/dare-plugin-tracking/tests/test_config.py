"""The ``tracking:`` section: structured with the run config, defaults, errors together with the
other sections', and the one-line errors of ``dare_configure`` before any work."""

from __future__ import annotations

import sys

import attrs
import pytest

import dare_plugin_tracking
from dare_core.config import render_with_help, resolve, to_dict
from dare_core.errors import ConfigError, DareError
from dare_core.testing import toy
from dare_core.testing.digits import DigitsPlugin
from dare_core.testing.registries import build_for
from dare_core.train import train
from dare_plugin_tracking import tracked_run
from dare_plugin_tracking.config import TensorBoardConfig, TrackingConfig, WandbConfig


@pytest.fixture
def dare():
    return build_for(toy, DigitsPlugin(), dare_plugin_tracking)


def _resolve(dare, tmp_path, *overrides):
    return resolve(
        dare,
        algo="pg_test",
        model="toy",
        overrides=[f"model.path={tmp_path}", f"output_dir={tmp_path / 'runs'}", *overrides],
    )


def _problems(info) -> list[str]:
    assert "\n" not in str(info.value)
    return info.value.problems


@pytest.mark.parametrize("cls", [TrackingConfig, TensorBoardConfig, WandbConfig])
def test_every_field_has_help_and_is_frozen(cls):
    for f in attrs.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(cls(), attrs.fields(cls)[0].name, None)


def test_the_section_is_off_by_default(dare, tmp_path):
    cfg = _resolve(dare, tmp_path)
    tracking = cfg.plugin_section("tracking")
    assert tracking == TrackingConfig() and tracking.backends == () and tracking.active() == ()
    assert tracking.wandb.mode == "offline"
    assert to_dict(cfg)["tracking"]["backends"] == []


def test_the_section_is_structured_from_overrides_and_files(dare, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("tracking:\n  backends: [tensorboard]\n  wandb: {project: p1}\n")
    cfg = resolve(
        dare,
        algo="pg_test",
        model="toy",
        config_file=str(path),
        overrides=[
            f"model.path={tmp_path}",
            "tracking.backends=[tensorboard, wandb]",
            "tracking.tags=[a, b]",
            "tracking.wandb.mode=online",
            "tracking.wandb.entity=me",
            "tracking.run_name=nice",
            "tracking.tensorboard.log_dir=tb",
        ],
    )
    assert cfg.plugin_section("tracking") == TrackingConfig(
        backends=("tensorboard", "wandb"),
        run_name="nice",
        tags=("a", "b"),
        tensorboard=TensorBoardConfig("tb"),
        wandb=WandbConfig("p1", "me", "online"),
    )


def test_section_problems_are_reported_with_the_others(dare, tmp_path):
    with pytest.raises(ConfigError) as info:
        _resolve(
            dare,
            tmp_path,
            "tracking.backend=[wandb]",
            "tracking.wandb.projct=x",
            "tracking.wandb.mode=cloud",
            "tracking.backends=[tensorbord, wandb]",
            "trainer.stepz=1",
            "trackng.backends=[wandb]",
        )
    assert _problems(info) == [
        "trackng: unknown key (did you mean 'tracking'?)",
        "trainer.stepz: unknown key (did you mean 'steps'?)",
        "tracking.backend: unknown key (did you mean 'backends'?)",
        "tracking.wandb.projct: unknown key (did you mean 'project'?)",
        "tracking.wandb.mode: expected one of 'offline', 'online', 'disabled', got 'cloud'",
        "tracking.backends: must list backends from: tensorboard, wandb; got 'tensorbord' "
        "(did you mean 'tensorboard'?)",
    ]


@pytest.mark.parametrize(
    "value,message",
    [
        ("tensorboard", "tracking.backends: must be a list, e.g. tracking.backends=[tensorboard]"),
        ("[wandb, wandb]", "tracking.backends: names a backend twice: ['wandb', 'wandb']"),
        ("[csv]", "tracking.backends: must list backends from: tensorboard, wandb; got 'csv'"),
        (
            "wandbb",
            "tracking.backends: must list backends from: tensorboard, wandb; got 'wandbb' (did you mean 'wandb'?)",
        ),
    ],
)
def test_bad_backend_lists(dare, tmp_path, value, message):
    with pytest.raises(ConfigError) as info:
        _resolve(dare, tmp_path, f"tracking.backends={value}")
    assert _problems(info) == [message]


def test_config_show_prints_the_section_with_its_help(dare, tmp_path):
    text = render_with_help(_resolve(dare, tmp_path, "tracking.backends=[wandb]"), dare)
    assert "\ntracking:  # Experiment tracking: TensorBoard / Weights & Biases" in text
    assert "\n  backends: [wandb]  # Trackers to write to" in text
    assert "\n  wandb:  # Weights & Biases options.\n    project: dare  # W&B project.\n" in text


@pytest.mark.parametrize(
    "backend,module,fix",
    [("wandb", "wandb", "pip install wandb"), ("tensorboard", "tensorboard", "pip install tensorboard")],
)
def test_a_missing_package_is_one_line_before_any_work(dare, tmp_path, monkeypatch, backend, module, fix):
    cfg = _resolve(dare, tmp_path, f"tracking.backends=[{backend}]", "run_name=r")
    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` now raises ImportError
    with pytest.raises(DareError) as info:
        train(dare, cfg)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"tracking.backends includes {backend!r} but {module} cannot be imported (")
    assert message.endswith(f"; {fix} (or remove {backend} from tracking.backends)")
    assert not (tmp_path / "runs").exists()  # refused before the run directory was created
    assert tracked_run.active() is None


def test_wandb_disabled_needs_no_package(dare, tmp_path, monkeypatch):
    cfg = _resolve(dare, tmp_path, "tracking.backends=[wandb]", "tracking.wandb.mode=disabled")
    monkeypatch.setitem(sys.modules, "wandb", None)
    dare_plugin_tracking.dare_configure(config=cfg)
    assert tracked_run.active() is None  # nothing to write to
    dare_plugin_tracking.dare_unconfigure(config=cfg)


def test_an_unknown_backend_in_a_config_built_in_code_is_refused(tmp_path):
    from dare_core.config import RunConfig

    with attrs.validators.disabled():  # past the field validator
        cfg = RunConfig(sections={"tracking": TrackingConfig(backends=("nope",))})
    with pytest.raises(DareError, match="tracking.backends: unknown backend 'nope'; choose from tensorboard, wandb"):
        dare_plugin_tracking.dare_configure(config=cfg)
