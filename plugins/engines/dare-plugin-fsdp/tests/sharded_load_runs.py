"""Rank functions of ``test_sharded_load.py`` (spawned by the testing kit's ``run_ranks``)."""

from __future__ import annotations

import os
import types
from typing import Any, Sequence

import torch

#: the bundled families fsdp shards (diffusiongemma's encoder shares its decoder's layers: refused)
FAMILIES = ("llada", "dream", "sdar", "llada2")


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter's full value (a sharded DTensor gathered)."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def _config(dare: Any, family: str, path: str, overrides: Sequence[str] = ()) -> Any:
    from dare_core.config import resolve

    over = ["model.device=cpu", f"model.path={path}", "engine.name=fsdp", *overrides]
    return resolve(dare, algo="sft", model=family, overrides=over)


def loaded_shards(families: Sequence[str]) -> dict[str, Any]:
    """Per family: the fsdp engine's load (meta → shard → fill) against ``from_pretrained``, its
    reference policy's logits against the policy's; then one SFT-style step from both loads. On
    rank 0 the facts the test checks."""
    from dare_core.plugins import get_dare
    from dare_core.workflows.runtime import load_model
    from dare_plugin_fsdp.engine import FSDPEngine

    dare = get_dare()
    out: dict[str, Any] = {}
    for family in families:
        spec = dare.registries.models.get(family)
        config = _config(dare, family, spec.default_checkpoint)
        engine = FSDPEngine(config)
        sharded = load_model(dare, config, device=engine.load_device)
        meta = all(p.is_meta for p in sharded.module.parameters())
        engine.prepare(sharded, trainable=True)
        full = spec.load(spec.default_checkpoint, dtype=torch.float32, device="cpu")
        want = full.module.state_dict()
        diff = max(float((_whole(t) - want[n]).abs().max()) for n, t in sharded.module.state_dict().items())
        ids = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = float((engine.reference(sharded).logits(ids) - sharded.logits(ids)).abs().max())
        out[family] = {"meta": meta, "diff": diff, "reference": ref, "step": _step_diff(engine, config, sharded, full)}
    return out if torch.distributed.get_rank() == 0 else {}


def _step_diff(engine: Any, config: Any, sharded: Any, full: Any) -> float:
    """The largest weight difference after one step of the sharded load and of the whole model
    sharded as before (the same rows, the same loss)."""
    from dare_plugin_fsdp.engine import FSDPEngine

    other = FSDPEngine(config)
    other.prepare(full, trainable=True)
    ids = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    for eng, w in ((engine, sharded), (other, full)):
        eng.setup_optimizer(w, config.trainer)
        noisy = ids.clone()
        noisy[:, ::2] = w.mask_token_id if w.mask_token_id >= 0 else 5
        logp = w.token_logprobs(noisy, ids, torch.ones_like(ids), prompt_len=2)
        eng.backward(-logp.mean())
        eng.step(1.0, 1e-3)
    a, b = dict(sharded.module.named_parameters()), dict(full.module.named_parameters())
    return max(float((_whole(a[n]) - _whole(b[n])).abs().max()) for n in a)


def load_peak(path: str, engine: str, out: str) -> dict[str, int]:
    """The private host memory (Linux ``RssAnon``: not the page cache the checkpoint's mmap
    reads through, which the node's ranks share and the kernel reclaims) this rank's process
    gains at most while the run's model is loaded and prepared on ``engine`` (``single`` or
    ``fsdp``), and then while it is exported into ``out/<engine>``
    (:class:`~dare_core.testing.memory.PeakSampler`), in bytes; and the parameter bytes it
    holds."""
    from dare_core.engines import build_engine
    from dare_core.plugins import get_dare
    from dare_core.testing.memory import PeakSampler
    from dare_core.workflows.runtime import load_model

    dare = get_dare()
    config = _config(dare, "llada", path, [f"engine.name={engine}"])
    eng = build_engine(dare, config)
    load_model(dare, config, device="meta")  # the modelling code imported before the baseline
    with PeakSampler("RssAnon") as peak:
        wrapper = load_model(dare, config, device=eng.load_device)
        eng.prepare(wrapper, trainable=True)
        for p in wrapper.module.parameters():  # every weight read, as a first step reads it
            p.detach().sum()
    ctx = types.SimpleNamespace(wrapper=wrapper, engine=eng, config=config)
    with PeakSampler("RssAnon") as export:
        _export(ctx, os.path.join(out, engine))
    return {"peak": peak.gain, "export": export.gain, "parameters": eng.memory()["parameters"]}


def _export(ctx: Any, directory: str) -> None:
    """The run's HF-layout export into ``directory`` (created by rank 0). Collective."""
    from dare_core.workflows.checkpoint import export_model

    if ctx.engine.is_main:
        os.makedirs(directory)
    ctx.engine.barrier()
    export_model(ctx, directory)


def shared_layers_refusal() -> str:
    """The fsdp engine's refusal of DiffusionGemma (its encoder runs on its decoder's weights)."""
    from dare_core.api import DareError
    from dare_core.plugins import get_dare
    from dare_core.workflows.runtime import load_model
    from dare_plugin_fsdp.engine import FSDPEngine

    dare = get_dare()
    spec = dare.registries.models.get("diffusiongemma")
    config = _config(dare, "diffusiongemma", spec.default_checkpoint)
    engine = FSDPEngine(config)
    try:
        engine.prepare(load_model(dare, config, device=engine.load_device), trainable=True)
    except DareError as err:
        return str(err)
    return ""
