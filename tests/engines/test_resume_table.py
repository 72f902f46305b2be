"""The resume table: every engine × precision × rollout backend, trained 3 RL steps without a
break and resumed from its step-1 checkpoint, gives the same steps 2-3 (every metric) and the
same final weights, bit for bit. The combinations an engine refuses by design are listed with
their one-line error.

The synced backend is the rollout-engine test double of ``tests/workflows/test_rollout_sync.py``
holding only the weights pushed to it (loaded from the pushed HF export, as an external engine
loads it): a push of the base weights before the restore shows in the resumed run's rollouts.
Each engine's combinations run in one process spawn (2 gloo ranks; the single engine: 1).
"""

from __future__ import annotations

import os
import sys

import pytest

from dare_core.api import RolloutSpec, hookimpl
from dare_core.errors import DareError
from dare_core.testing import toy
from dare_core.testing.distributed import run_ranks
from dare_core.testing.engines import TINY, max_weight_diff, same_records, train_run

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # the test double's package
from workflows.test_rollout_sync import PUSHES, CopyEngine  # noqa: E402

from dare_plugin_samplers.config import LowConfidenceConfig  # noqa: E402

PRECISIONS = {
    "fp32": ["engine.precision=fp32"],
    "bf16-mixed": ["engine.precision=bf16-mixed"],
    "bf16-kahan": ["engine.precision=bf16", "engine.bf16_update=kahan"],
    "bf16-stochastic": ["engine.precision=bf16", "engine.bf16_update=stochastic"],
}
BACKENDS = {"in-process": ["rollout.backend=low_confidence"], "synced": ["rollout.backend=pushed_only"]}
ENGINES = {  # name: (processes, plugins)
    "single": (1, ()),
    "ddp": (2, ()),
    "fsdp": (2, ("dare_plugin_fsdp.plugin",)),
    "deepspeed": (2, ("dare_plugin_deepspeed.plugin",)),
}
#: (engine, precision) refused by design: the start of the one-line error (every backend)
REFUSED = {
    ("fsdp", "bf16-stochastic"): "engine.name=fsdp implements engine.precision=bf16 with engine.bf16_update=kahan only",
    ("deepspeed", "bf16-kahan"): "engine.name=deepspeed does not run engine.precision=bf16",
    ("deepspeed", "bf16-stochastic"): "engine.name=deepspeed does not run engine.precision=bf16",
}


class PushedOnly(CopyEngine):
    """Generates from the last HF export pushed to it (``sync=directory``), in the policy's
    parameter dtype; nothing before the first push."""

    def load_weights(self, weights, step):
        if self.copy is None:
            self.copy = toy.load(weights)
        super().load_weights(weights, step)

    def generate(self, wrapper, prompt_ids, prompt_mask, *, record=frozenset(), generator=None):
        self.copy.module.to(next(wrapper.module.parameters()).dtype)
        return self.sampler.generate(self.copy, prompt_ids, prompt_mask, record=record, generator=generator)


class PushedOnlyPlugin:
    @hookimpl
    def dare_register_rollout_backends(self, register):
        register(
            RolloutSpec(
                name="pushed_only",
                config_cls=LowConfidenceConfig,
                build=lambda cfg: PushedOnly(cfg, "directory"),
                kinds=frozenset({"masked"}),
                sync="directory",
            )
        )


def resume_rows(engine: str, plugins: tuple[str, ...], root: str) -> dict[tuple[str, str], object]:
    """On every rank: each (precision, backend) of ``engine`` trained 3 steps, then resumed from
    its step-1 checkpoint; rank 0's ``{(precision, backend): (full run, resumed run) or the
    DareError message}``."""
    import torch.distributed as dist

    if int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group("gloo")  # one group for every run (the engines join it)
    plugins = (*plugins, f"{__name__}:PushedOnlyPlugin")
    out: dict[tuple[str, str], object] = {}
    for precision, extra in PRECISIONS.items():
        for backend, rollout in BACKENDS.items():
            name = f"{engine}-{precision}-{backend}"
            common = [
                *TINY,
                f"model.path={root}/ckpt",
                f"output_dir={root}",
                f"run_name={name}",
                "trainer.save_every=1",
                "trainer.lr=1e-2",
                f"engine.name={engine}",
                *extra,
                *rollout,
            ]
            try:
                full = train_run(plugins, "pg_test", common)
            except DareError as exc:
                out[precision, backend] = str(exc)
                continue
            PUSHES.clear()
            if dist.is_initialized():
                dist.barrier()
            if os.environ["RANK"] == "0":  # resumable as after a crash that followed step 1
                os.remove(os.path.join(root, name, "summary.json"))
            if dist.is_initialized():
                dist.barrier()
            resumed = train_run(plugins, "pg_test", [*common, f"trainer.resume={root}/{name}/checkpoints/step-1"])
            out[precision, backend] = (full, resumed, [(h, s) for h, s, _ in PUSHES])
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize("engine", list(ENGINES))
def test_resume_equals_the_uninterrupted_run(tmp_path, engine):
    nprocs, plugins = ENGINES[engine]
    rows = run_ranks(nprocs, resume_rows, engine, plugins, str(tmp_path))[0]
    assert set(rows) == {(p, b) for p in PRECISIONS for b in BACKENDS}
    for (precision, backend), row in rows.items():
        refused = REFUSED.get((engine, precision))
        if refused is not None:
            assert isinstance(row, str) and row.startswith(refused) and "\n" not in row, (precision, row)
            continue
        assert not isinstance(row, str), (precision, backend, row)
        full, resumed, pushes = row
        assert [r["step"] for r in resumed["records"]] == [1, 2, 3]
        assert same_records(full["records"], resumed["records"], rel=0.0) == [], (precision, backend)
        assert max_weight_diff(full["weights"], resumed["weights"]) == 0.0, (precision, backend)
        if backend == "synced":  # the restored policy, then each step's (training and evaluation engine)
            assert pushes == [("directory", s) for s in (0, 0, 2, 2, 3, 3)], pushes
