"""Training checkpoints and exact resume.

A training checkpoint ``<run>/checkpoints/step-N/`` holds the HF-layout export of the model
(loadable with the family's ``from_pretrained`` and ``--model-path``), the engine's model and
optimizer state under ``state/`` (sharded where the engine shards), one ``rank-R.pt`` per rank
(its data position and random streams) and ``trainer_state.json`` (step, world size, tracker
state). It is written into ``checkpoints/.tmp-step-N`` and renamed when every rank has finished,
so a directory named ``step-N`` is always complete; a ``.tmp-*`` left by a killed run is
skipped (with a warning) and removed. ``trainer.resume=auto`` continues from the newest one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from typing import Any, Optional

import numpy as np
import torch

from dare_core.errors import DareError, DivergenceError
from dare_core.rundir import atomic_write_text, fsync_dir

TRAINER_STATE = "trainer_state.json"
STEP_DIR = re.compile(r"^step-(\d+)$")

#: config fields a resumed run may change (they do not change what is computed)
RESUMABLE_CHANGES = (
    "trainer.resume",
    "trainer.keep_last",
    "trainer.save_every",
    "trainer.log_every",
    "trainer.save_final",
    "trainer.steps",
    "trainer.max_nonfinite_steps",
    "progress",
    "output_dir",
    "run_name",
)


def rng_state() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"python": random.getstate(), "torch": torch.get_rng_state(), "cuda": cuda, "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def export_model(ctx: Any, directory: str, merge: Optional[bool] = None) -> None:
    """Write the policy in HF layout (LoRA: the PEFT adapter) into ``directory`` in the storage
    dtype ``model.dtype`` (``merge``: LoRA merged, default ``model.lora.merge_on_save``): from
    every rank's shards where the engine writes them (:meth:`Engine.export_weights`), else
    consolidated on rank 0, which writes; refused (on every rank) when a weight is not finite.
    Collective."""
    from dare_core.models import lora
    from dare_core.workflows.runtime import DTYPES

    wrapper, storage = ctx.wrapper, DTYPES[ctx.config.model.dtype]
    if not lora.is_lora(wrapper) and ctx.engine.export_weights(wrapper, directory, storage):
        return _copy_preset(ctx, directory)
    full = ctx.engine.full_state_dict(wrapper)
    state = (full if full is not None else wrapper.module.state_dict()) if ctx.engine.is_main else {}
    bad = ctx.engine.gather(
        [next((k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)]
    )[0]
    if bad is not None:
        raise DivergenceError(
            f"not writing {os.path.basename(directory).removeprefix('.tmp-')}: weight {bad} is not "
            f"finite (earlier checkpoints are kept); lower trainer.lr or check the data"
        )
    if not ctx.engine.is_main:
        return
    if lora.is_lora(wrapper):
        lora.save_checkpoint(
            wrapper, directory, merge=ctx.config.model.lora.merge_on_save if merge is None else merge, state_dict=full
        )
    else:
        if any(v.is_floating_point() and v.dtype != storage for v in state.values()):
            state = {k: v.to(storage) if v.is_floating_point() else v for k, v in state.items()}
        elif full is None:
            state = None  # the module's own weights, already in the storage dtype
        wrapper.save_pretrained(directory, state_dict=state)
    _copy_preset(ctx, directory)


def _copy_preset(ctx: Any, directory: str) -> None:
    """A saved model keeps the run presets of the checkpoint it started from (rank 0 copies)."""
    from dare_core.config.loader import PRESET_FILE

    preset = os.path.join(str(ctx.config.model.path), PRESET_FILE)
    if ctx.engine.is_main and os.path.isfile(preset):
        shutil.copy2(preset, os.path.join(directory, PRESET_FILE))


def push_policy(ctx: Any, backend: Any, how: str, step: int) -> None:
    """Give a rollout engine outside this process the updated policy (``RolloutSpec.sync``), LoRA
    merged, in the checkpoint's names: ``directory`` — an HF export ``<run>/rollout-policy`` (any
    engine); ``state`` — ``(name, tensor)`` pairs (engines whose every rank holds the whole model).
    ``step``: the optimizer steps the policy has had in this process (0: as the run starts or
    resumes). Collective; every rank calls ``backend.load_weights``."""
    import copy

    from dare_core.models import lora

    wrapper, engine = ctx.wrapper, ctx.engine
    if how == "directory":
        target = (
            ctx.rundir.path("rollout-policy") if ctx.rundir else os.path.join(ctx.config.output_dir, "rollout-policy")
        )
        _write_dir(ctx, target, lambda tmp: export_model(ctx, tmp, merge=True))
        return backend.load_weights(target, step)
    full = engine.full_state_dict(wrapper)
    if engine.gather([full is not None])[0] != (full is not None):
        raise DareError(
            f"a rollout backend taking tensors (sync=state) needs the whole model on every rank; the "
            f"{engine.name} engine shards it: use a backend with sync=directory or engine=ddp"
        )
    if lora.is_lora(wrapper):
        full = copy.deepcopy(wrapper.module).merge_and_unload().state_dict()
    backend.load_weights((full if full is not None else wrapper.module.state_dict()).items(), step)


def save_final(ctx: Any) -> Optional[str]:
    """The HF-layout export ``<run>/final``. Collective; its path (on every rank)."""
    if ctx.rundir is None:
        return None
    target = ctx.rundir.path("final")
    _write_dir(ctx, target, lambda tmp: export_model(ctx, tmp))
    return target


def save_training_checkpoint(ctx: Any, step: int, trainer_state: dict[str, Any], rank_state: dict[str, Any]) -> str:
    """Write ``checkpoints/step-<step>`` (see the module docstring). Collective."""
    engine = ctx.engine

    def write(tmp: str) -> None:
        if engine.is_main:
            os.makedirs(os.path.join(tmp, "state"))
        engine.barrier()
        engine.save_state(os.path.join(tmp, "state"))
        export_model(ctx, tmp)
        torch.save({**rank_state, "rng": rng_state()}, os.path.join(tmp, f"rank-{engine.rank}.pt"))
        if engine.is_main:
            state = {"step": step, "world_size": engine.world_size, "engine": engine.name, **trainer_state}
            atomic_write_text(os.path.join(tmp, TRAINER_STATE), json.dumps(state) + "\n")

    root = ctx.rundir.path("checkpoints")
    target = os.path.join(root, f"step-{step}")
    _write_dir(ctx, target, write)
    if engine.is_main and ctx.config.trainer.keep_last:
        for old in complete_checkpoints(root)[: -ctx.config.trainer.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    engine.barrier()
    return target


def _write_dir(ctx: Any, target: str, write: Any) -> None:
    """Every rank calls ``write(tmp)`` on ``.tmp-<name>`` beside ``target``; then rank 0 renames
    it to ``target`` (replacing an older one). A failure removes the temp directory and leaves
    ``target`` as it was; a killed process leaves it for :func:`find_resume` to report."""
    engine = ctx.engine
    tmp = os.path.join(os.path.dirname(target), ".tmp-" + os.path.basename(target))
    if engine.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    engine.barrier()
    try:
        write(tmp)
    except BaseException:
        if engine.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    engine.barrier()
    if engine.is_main:
        fsync_dir(tmp)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_dir(os.path.dirname(target))
    engine.barrier()


def complete_checkpoints(root: str) -> list[str]:
    """``step-N`` directories under ``root`` holding a trainer state, oldest first."""
    if not os.path.isdir(root):
        return []
    found = [
        (int(m.group(1)), os.path.join(root, n))
        for n in os.listdir(root)
        if (m := STEP_DIR.match(n)) and os.path.isfile(os.path.join(root, n, TRAINER_STATE))
    ]
    return [p for _, p in sorted(found)]


def find_resume(config: Any, run_root: str, log: Any) -> Optional[str]:
    """The checkpoint ``trainer.resume`` names (``None``: start fresh). Removes the debris of a
    checkpoint cut off mid-write, with a one-line warning."""
    resume = config.trainer.resume
    if not resume:
        return None
    if resume != "auto":
        if not os.path.isfile(os.path.join(resume, TRAINER_STATE)):
            raise DareError(
                f"trainer.resume={resume}: no training checkpoint there (no {TRAINER_STATE}); "
                f"give a <run>/checkpoints/step-N directory written with trainer.save_every, "
                f"or auto"
            )
        return resume
    root = os.path.join(run_root, "checkpoints")
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            if name.startswith(".tmp-"):
                log(f"warning: skipping checkpoint {name[5:]}, cut off mid-write; removing it")
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    found = complete_checkpoints(root)
    return found[-1] if found else None


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: str) -> None:
    """Refuse to resume when a config field that changes what is computed differs from the
    checkpoint's run (the first such field named)."""

    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    a, b = flat(saved), flat(current)
    allowed = set(RESUMABLE_CHANGES)
    if a.get("trainer.lr_schedule") != "constant" or a.get("trainer.warmup_ratio"):
        allowed.discard("trainer.steps")  # the schedule depends on the number of steps
    changed = sorted(
        k
        for k in set(a) | set(b)
        if a.get(k) != b.get(k) and k not in allowed and not k.startswith(("eval.", "tracking."))
    )
    if changed:
        k = changed[0]
        raise DareError(
            f"trainer.resume: {k} was {a.get(k)!r} in the run of {path}, now {b.get(k)!r}; "
            f"resume with the checkpoint's value (or start a new run: another run_name)"
        )
