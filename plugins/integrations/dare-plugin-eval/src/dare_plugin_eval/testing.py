"""For tests of the suite, with the toy family: a second test task (``first_digit``: answers and
failure kinds) beside the testing kit's ``digits``, and :func:`suite_on`, which runs
:func:`~dare_plugin_eval.suite.run_suite` with registries built from import paths, so it can be
the target of :func:`dare_core.testing.distributed.run_ranks` (picklable)."""

from __future__ import annotations

import importlib
from typing import Any, Optional, Sequence

from dare_core.api import Score, TaskSpec, hookimpl
from dare_core.testing.digits import DigitsTask
from dare_core.testing.registries import build_for

__all__ = ["FirstDigitPlugin", "FirstDigitTask", "PLUGINS", "TINY", "suite_on"]

#: the toy family (untrained), the reference samplers, ``digits``, ``first_digit`` and ``dare eval``
PLUGINS = (
    "dare_plugin_samplers",
    "dare_core.testing.toy",
    "dare_core.testing.digits:DigitsPlugin",
    "dare_plugin_eval.testing:FirstDigitPlugin",
    "dare_plugin_eval",
)

#: a tiny evaluation of the toy model: 5 prompts, 4-token responses in 2 denoising steps
TINY = (
    "rollout.gen_length=4",
    "rollout.block_length=4",
    "eval.steps=2",
    "eval.batch_size=3",
    "task.num_eval=5",
    "progress=false",
    "model.device=cpu",
)


class FirstDigitTask(DigitsTask):
    """``digits``' prompts; the answer is the response's first character, correct when it is a
    digit of the reference's parity; kinds ``digit``, ``other``, ``empty``."""

    name = "first_digit"

    def score(self, example, response):
        pred = response[:1]
        kind = "empty" if not pred else "digit" if pred.isdigit() else "other"
        ok = float(pred.isdigit() and int(pred) % 2 == int(example.ground_truth) % 2)
        return Score(ok, ok, pred, kind)


class FirstDigitPlugin:
    @hookimpl
    def dare_register_tasks(self, register):
        register(TaskSpec("first_digit", FirstDigitTask, "test task with answers and failure kinds"))


def plugin(spec: str) -> Any:
    """The plugin of an import path: ``module`` or ``module:Class`` (an instance)."""
    module, _, attr = spec.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr)() if attr else mod


def suite_on(
    plugins: Sequence[str],
    model: str,
    tasks: Sequence[Optional[str]],
    overrides: Sequence[str],
    samples: int = 1,
    ks: Sequence[int] = (1,),
) -> dict[str, Any]:
    """The results of ``run_suite`` with the registries of ``plugins`` (import paths)."""
    from dare_plugin_eval.suite import run_suite

    return run_suite(build_for(*map(plugin, plugins)), model, tasks, samples=samples, ks=ks, overrides=overrides)
