"""Rank functions of ``test_sharded_export.py`` (spawned by the testing kit's ``run_ranks``)."""

from __future__ import annotations

import json
import os
import types
from typing import Any

import torch
from sharded_load_runs import _config


def _context(family: str, overrides: tuple[str, ...] = ()) -> Any:
    """An fsdp run's policy (sharded load), trained one step, as ``export_model`` takes it."""
    from dare_core.plugins import get_dare
    from dare_core.workflows.runtime import load_model
    from dare_plugin_fsdp.engine import FSDPEngine

    dare = get_dare()
    config = _config(dare, family, dare.registries.models.get(family).default_checkpoint, overrides)
    engine = FSDPEngine(config)
    wrapper = load_model(dare, config, device=engine.load_device)
    engine.prepare(wrapper, trainable=True)
    engine.setup_optimizer(wrapper, config.trainer)
    ids = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    engine.backward(-wrapper.token_logprobs(ids, ids, torch.ones_like(ids), prompt_len=2).mean())
    engine.step(1.0, 1e-2)
    return types.SimpleNamespace(wrapper=wrapper, engine=engine, config=config)


def exported(family: str, out: str, dtype: str, max_file_bytes: int = 0) -> dict[str, Any]:
    """Export with every rank writing its shards (``max_file_bytes``: a smaller file size than
    the 5 GB default); on rank 0: the export loaded with the family's ``load`` against the
    weights gathered to one rank (the export as it was), the files written, the config."""
    import dare_plugin_fsdp.export
    from dare_core.plugins import get_dare
    from dare_core.workflows.checkpoint import export_model

    if max_file_bytes:
        dare_plugin_fsdp.export.MAX_FILE_BYTES = max_file_bytes
    ctx = _context(family, (f"model.dtype={dtype}",))
    if ctx.engine.is_main:
        os.makedirs(out)
    ctx.engine.barrier()
    export_model(ctx, out)
    gathered = ctx.engine.full_state_dict(ctx.wrapper)
    if not ctx.engine.is_main:
        return {}
    spec = get_dare().registries.models.get(family)
    loaded = spec.load(out, dtype=torch.float32, device="cpu").module.state_dict()
    storage = getattr(torch, dtype)
    diff = max(float((loaded[n] - gathered[n].to(storage).float()).abs().max()) for n in gathered)
    with open(os.path.join(out, "config.json")) as fh:
        config = json.load(fh)
    return {"diff": diff, "files": sorted(os.listdir(out)), "config": config, "names": _saved_names(out)}


def _saved_names(directory: str) -> list[str]:
    """The tensor names of an export's safetensors files."""
    from safetensors import safe_open

    names: list[str] = []
    for f in sorted(os.listdir(directory)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(directory, f), framework="pt") as fh:
                names += list(fh.keys())
    return sorted(names)


def single_export(family: str, out: str) -> dict[str, Any]:
    """The single-process export of the family's bundled checkpoint: its config and names."""
    from dare_core.engines.single import SingleProcessEngine
    from dare_core.plugins import get_dare
    from dare_core.workflows.checkpoint import export_model
    from dare_core.workflows.runtime import load_model

    dare = get_dare()
    config = _config(dare, family, dare.registries.models.get(family).default_checkpoint, ("engine.name=single",))
    engine = SingleProcessEngine(config)
    wrapper = load_model(dare, config, device=engine.load_device)
    engine.prepare(wrapper, trainable=True)
    os.makedirs(out)
    export_model(types.SimpleNamespace(wrapper=wrapper, engine=engine, config=config), out)
    with open(os.path.join(out, "config.json")) as fh:
        return {"config": json.load(fh), "names": _saved_names(out)}


def nonfinite_export(out: str) -> str:
    """A NaN in rank 1's shard: the refusal every rank raises (rank 0's message), nothing written."""
    from dare_core.api import DivergenceError
    from dare_core.workflows.checkpoint import export_model

    ctx = _context("llada")
    if ctx.engine.rank == 1:
        with torch.no_grad():
            next(ctx.wrapper.module.parameters()).to_local().view(-1)[0] = float("nan")
    if ctx.engine.is_main:
        os.makedirs(out)
    ctx.engine.barrier()
    try:
        export_model(ctx, out)
    except DivergenceError as err:
        return f"{err} | files: {os.listdir(out)}"
    return ""
