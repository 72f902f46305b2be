"""Training runs for the tests, batched: one set of processes trains several runs in a row (the
imports and the process start are paid once per set), each run joining its own process group on
its own port."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Sequence

import torch

from dare_core.testing.distributed import free_port, run_ranks
from dare_core.testing.engines import BASE_PLUGINS, TINY

FSDP = "dare_plugin_fsdp.plugin"


def train_read(plugins: Sequence[str], algo: str, overrides: Sequence[str]) -> dict[str, Any]:
    """Train on the toy model; on rank 0 the run's step records, its final export's weights
    (``toy.pt``, or the LoRA adapter's tensors) and the run directory (``{}`` on other ranks)."""
    from safetensors.torch import load_file

    from dare_core.config import resolve
    from dare_core.testing.engines import _plugin
    from dare_core.testing.registries import build_for
    from dare_core.train import train

    dare = build_for(*[_plugin(p) for p in (*BASE_PLUGINS, *plugins)])
    summary = train(dare, resolve(dare, algo=algo, model="toy", overrides=list(overrides)))
    if os.environ.get("RANK", "0") != "0":
        return {}
    root = summary["run_dir"]
    with open(os.path.join(root, "metrics.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    final = os.path.join(root, "final")
    adapter = glob.glob(os.path.join(final, "lora_adapter", "*.safetensors"))
    weights = load_file(adapter[0]) if adapter else torch.load(os.path.join(final, "toy.pt"), weights_only=True)
    return {"weights": weights, "records": records, "run_dir": root, "summary": summary}


def _train_jobs(jobs: list[tuple]) -> list[dict[str, Any]]:
    """``(port, plugins, algo, overrides, files to remove)`` for each run, in order."""
    out = []
    for port, plugins, algo, overrides, remove in jobs:
        for path in remove:
            if os.path.exists(path):
                os.remove(path)
        os.environ["MASTER_PORT"] = str(port)
        out.append(train_read(plugins, algo, overrides))
    return out


def train_batch(nprocs: int, jobs: dict[str, tuple], common: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{name: (plugins, algo, overrides[, files])}`` trained in order on ``nprocs`` ranks, each
    run with :data:`~dare_core.testing.engines.TINY`, ``common``, ``run_name=<name>`` and its own
    overrides (later ones win), after removing ``files`` (absolute paths; e.g. the summary of a
    finished run, so that it resumes as after a crash); rank 0's results by name."""
    payload = [
        (
            free_port(),
            tuple(job[0]),
            job[1],
            [*TINY, *common, f"run_name={name}", *job[2]],
            tuple(job[3]) if len(job) > 3 else (),
        )
        for name, job in jobs.items()
    ]
    results = run_ranks(nprocs, _train_jobs, payload)[0]
    return dict(zip(jobs, results))


def llada_steps(tmp: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The bundled tiny LLaDA checkpoint (4 decoder layers, gradient checkpointing on, the
    logits-free cross entropy) trained two steps by the fsdp engine on this rank's half of a
    batch and by the single-process engine on the whole batch; the second step again after
    ``load_state`` of the state saved after the first. On rank 0: the differences and facts the
    test checks (``{}`` on other ranks)."""
    from torch.distributed.fsdp import FSDPModule

    import dare_plugin_fsdp.plugin as fsdp_plugin
    from dare_core.api import SingleProcessEngine
    from dare_core.config import resolve
    from dare_core.testing import toy
    from dare_core.testing.digits import DigitsPlugin
    from dare_core.testing.registries import build_for
    from dare_plugin_fsdp.engine import FSDPEngine
    from dare_plugin_llada.wrapper import BUNDLED, load

    dare = build_for(toy, DigitsPlugin(), fsdp_plugin)
    config = resolve(
        dare,
        algo="sup_test",
        model="toy",
        overrides=["model.device=cpu", f"model.path={tmp}", "engine.name=fsdp", "trainer.lr=1e-3", *overrides],
    )
    engine, single = FSDPEngine(config), SingleProcessEngine(config)
    wrappers = []
    for eng in (single, engine):
        w = load(BUNDLED)
        w.module.gradient_checkpointing_enable()
        w.fused_ce = True
        eng.prepare(w, trainable=True)
        eng.setup_optimizer(w, config.trainer)
        wrappers.append(w)
    ws, wf = wrappers
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 600, (4, 12), generator=gen)
    noisy = ids.masked_fill(torch.rand(ids.shape, generator=gen) < 0.5, ws.mask_token_id)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mine = torch.tensor(engine.shard(range(4)))
    facts: dict[str, Any] = {}

    def loss(eng, w, rows):
        with eng.autocast():
            logp = w.token_logprobs(noisy[rows], ids[rows], mask[rows])
        per_row = (logp * mask[rows]).sum(1) / mask[rows].sum(1)
        return -per_row.mean()

    with torch.no_grad():
        ref = engine.reference(wf)
        facts["reference_diff"] = float(
            (ref.logits(noisy[mine], mask[mine]) - wf.logits(noisy[mine], mask[mine])).abs().max()
        )
        facts["reference_sharded"] = all(isinstance(m, FSDPModule) for m in ref.decoder_layers())

    def step(eng, w, rows):
        eng.backward(loss(eng, w, rows))
        return eng.step(1.0, 1e-3)

    for eng, w, rows in ((single, ws, torch.arange(4)), (engine, wf, mine)):
        step(eng, w, rows)
    state = os.path.join(tmp, "state")
    os.makedirs(state, exist_ok=True)
    engine.barrier()
    engine.save_state(state)
    norms = [step(eng, w, rows)[0] for eng, w, rows in ((single, ws, torch.arange(4)), (engine, wf, mine))]
    after_two = engine.full_state_dict(wf)
    engine.load_state(state)
    step(engine, wf, mine)
    again = engine.full_state_dict(wf)
    frozen, plain = load(BUNDLED), load(BUNDLED)
    engine.prepare(frozen, trainable=False)  # evaluation: a model that is never trained
    with torch.no_grad():
        facts["inference_diff"] = float(
            (frozen.logits(noisy[mine], mask[mine]) - plain.logits(noisy[mine], mask[mine])).abs().max()
        )
    layers = wf.decoder_layers()
    facts.update(
        layers=len(layers),
        sharded=all(isinstance(m, FSDPModule) for m in layers),
        checkpointing=all(getattr(m, "gradient_checkpointing", False) for m in layers),
        local_fraction=sum(p.to_local().numel() for p in wf.module.parameters())
        / sum(p.numel() for p in wf.module.parameters()),
    )
    engine.close()
    if not engine.is_main:
        return {}
    full = ws.module.state_dict()
    facts.update(
        norms=norms,
        keys_match=set(after_two) == set(full),
        weight_diff=max(float((after_two[k].float() - full[k].float()).abs().max()) for k in full),
        resumed_diff=max(float((again[k] - after_two[k]).abs().max()) for k in after_two),
        moved=max(float((full[k] - v).abs().max()) for k, v in load(BUNDLED).module.state_dict().items()),
    )
    return facts


def llada_batch(tmp: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    return run_ranks(2, llada_steps, tmp, list(overrides))[0]
