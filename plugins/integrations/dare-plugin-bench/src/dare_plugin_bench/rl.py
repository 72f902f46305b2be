"""``dare bench rl``: one RL step end to end, eager vs accelerated.

A step is what the RL workflow does per optimizer step, built from the core's registered
components (no algorithm plugin involved): rollout of ``--batch`` rows (``--batch //
--group-size`` prompts, each repeated ``--group-size`` times) → rewards (the ``--task`` reward of
the decoded responses; without a task, seeded random 0/1 rewards, so the update does real work on
random prompts) → group-normalised advantages (``group_norm``) → one corruption draw
(``random_ratio``) → old log-likelihoods without gradients (``response_token_logprob``) → the
update ``dare train`` runs (:func:`dare_core.api.update` with the RL objective of the
clipped policy-gradient loss ``clipped_pg`` through the single-process engine: micro-batches
normalised over the batch, clipping, AdamW step). The *eager* side uses the baseline rollout backend, the *accelerated*
side the accelerated one; the training half is the same code on both sides except for the
training paths (``--baseline-train``, default ``padded,naive``: padded attention and full
logits; ``--accelerated-train``, default ``auto,auto``: packed attention and the fused,
logits-free cross entropy wherever the model supports them; see :mod:`dare_core.ops.paths`). Both sides start every step from the same
weights and optimizer state (restored outside the timing), interleaved. When the accelerated
rollout runs static-shape steps (``graphs`` other than ``eager``; ``auto`` on CUDA) a third side,
*cached*, runs the same backend with ``graphs=eager``, so the gain of the captured steps is read
beside the gain of the cache.

``--preset paper-masked`` / ``paper-block`` run the paper's RL configuration (:data:`PRESETS`:
group 8, block 32, responses of 256 and 512 tokens, each length its own interleaved comparison)
and print the ratios of both lengths side by side.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Optional

import attrs
import click
import torch

from dare_plugin_bench.common import emit_json, interleave, machine_info, print_table, ratio
from dare_plugin_bench.rollout import graphs_twin
from dare_plugin_bench.setup import ACCELERATED_DEFAULTS, build, config_text, model_options, rollout_config

#: ``--preset``: option values (applied where the option is left at its default), the response
#: lengths, the denoising steps of one length and the rollout settings each side starts from
#: (its ``-b`` / ``-a`` come after them). Masked: the no-cache reference sampler against the dual
#: cache, both with two tokens per step; block: the block backend recomputing the prefix against
#: its block KV cache, 16 iterations per 32-token block. Both sides decode every row to the full
#: length (no stop), so they do the same work.
PRESETS: dict[str, dict[str, Any]] = {
    "paper-masked": {
        "options": {
            "group_size": 8,
            "batch": 8,
            "block_length": 32,
            "temperature": 0.6,
            "baseline_backend": "low_confidence",
            "accelerated_backend": "fast",
        },
        "gen_lengths": (256, 512),
        "steps": lambda gen_length: gen_length // 2,
        "baseline": (),
        "accelerated": ("cache=dual", "decoding=quota"),
    },
    "paper-block": {
        "options": {
            "group_size": 8,
            "batch": 8,
            "block_length": 32,
            "temperature": 1.0,
            "baseline_backend": "block",
            "accelerated_backend": "block",
        },
        "gen_lengths": (256, 512),
        "steps": lambda gen_length: 16,
        "baseline": ("use_cache=false", "graphs=eager", "stop_at_stop_token=false"),
        "accelerated": ("use_cache=true", "stop_at_stop_token=false"),
    },
}


def _engine(wrapper: Any, lr: float) -> Any:
    """The single-process engine ``dare train`` builds for this wrapper (its precision policy,
    AdamW with the trainer's defaults at ``lr``, clipping), with the optimizer set up."""
    from dare_core.api import RunConfig, SingleProcessEngine

    cfg = RunConfig()
    cfg = attrs.evolve(
        cfg, model=attrs.evolve(cfg.model, device=str(wrapper.device)), trainer=attrs.evolve(cfg.trainer, lr=lr)
    )
    engine = SingleProcessEngine(cfg, wrapper.device)
    engine.setup_optimizer(wrapper, cfg.trainer)
    return engine


def _rl_step(setup: Any, backend: Any, lookup: Any, engine: Any, group: int, micro: int, seed: int) -> dict[str, Any]:
    from dare_core.api import PolicyObjective, RLComponents, UpdateBatch, UpdatePlan, estimate_no_grad, update

    wrapper = setup.wrapper
    device = wrapper.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    corruption = lookup.corruption("random_ratio")
    estimator = lookup.estimator("response_token_logprob")
    objective = PolicyObjective(RLComponents(estimator=estimator, loss=lookup.loss("clipped_pg")), wrapper, engine)
    advantage = lookup.advantage("group_norm")
    tr = engine.config.trainer
    t0 = time.perf_counter()
    tokens, nfe, rollouts = 0, 0, []
    for pid, pmask, examples in setup.prompts:
        out = backend.generate(wrapper, pid, pmask, generator=gen)
        tokens += out.response_ids.numel()
        nfe += int(out.nfe)
        rollouts.append((out, examples))
    t_roll = time.perf_counter()
    loss_total, logp_s, update_s = 0.0, 0.0, 0.0
    for out, examples in rollouts:
        b = out.response_ids.shape[0]
        if setup.task is not None and examples is not None:
            from dare_core.api import decode_responses

            texts = decode_responses(wrapper, out.response_ids.cpu(), out.response_mask.cpu())
            rewards = torch.tensor(
                [setup.task.score(ex, t).score for ex, t in zip(examples, texts)], dtype=torch.float32
            )
        else:
            rewards = torch.randint(0, 2, (b,), generator=gen).float()
        group_ids = torch.arange(b) // group
        adv = advantage(rewards, group_ids).to(device)
        batch = out.sequences()
        corrupted = corruption(wrapper, batch, gen)
        ta = time.perf_counter()
        old = estimate_no_grad(engine, estimator, wrapper, batch, corrupted, micro)
        tb = time.perf_counter()
        wrapper.module.train()
        part = UpdateBatch(batch, corrupted, old, None, adv, batch.response_mask.float())
        stats = update(engine, objective, [part], UpdatePlan(micro_batch=micro, grad_clip=tr.grad_clip, lr=tr.lr))
        loss_total += stats.loss
        tc = time.perf_counter()
        logp_s += tb - ta
        update_s += tc - tb
    return {
        "tokens": tokens,
        "nfe": nfe,
        "rollout_s": t_roll - t0,
        "logprob_s": logp_s,
        "update_s": update_s,
        "loss": loss_total,
    }


@click.command("rl")
@model_options
@click.option(
    "--group-size",
    default=2,
    show_default=True,
    type=int,
    help="Rows per prompt group (advantage normalisation); must divide --batch.",
)
@click.option(
    "--micro-batch",
    default=0,
    show_default=True,
    type=int,
    help="Rows per forward/backward of the update (0 = --batch).",
)
@click.option("--lr", default=1e-6, show_default=True, type=float, help="AdamW learning rate.")
@click.option(
    "--baseline-train",
    default="padded,naive",
    show_default=True,
    metavar="ATTENTION,CE",
    help="Training paths of the eager side: attention (padded, packed, auto) and cross "
    "entropy (naive, fused, auto), comma separated.",
)
@click.option(
    "--accelerated-train",
    default="auto,auto",
    show_default=True,
    metavar="ATTENTION,CE",
    help="Training paths of the accelerated side (auto = what the model supports).",
)
@click.option(
    "--preset",
    type=click.Choice(sorted(PRESETS)),
    default=None,
    help="The paper's RL configuration for masked (paper-masked: low_confidence vs fast "
    "dual cache) or block diffusion (paper-block: block without vs with its KV "
    "cache): group 8, batch 8, block 32, responses 256 and 512 (one comparison "
    "each, ratios side by side), two tokens per step; options given explicitly "
    "win, -b/-a add to the preset's side settings.",
)
@click.option(
    "--warmup",
    default=0,
    show_default=True,
    type=int,
    help="Untimed steps of every side before the timed ones (one-time costs such as "
    "capturing CUDA graphs stay out of the timing).",
)
def rl_cmd(
    group_size: int,
    micro_batch: int,
    lr: float,
    baseline_train: str,
    accelerated_train: str,
    preset: Optional[str],
    warmup: int,
    **kw: Any,
) -> None:
    """RL step time (rollout + log-probs + update): eager vs accelerated rollout, interleaved."""
    from dare_core.api import ComponentLookup, DareError, get_dare
    from dare_plugin_bench.common import BenchError

    lengths = [kw["gen_length"]]
    steps_of = None
    if preset:
        chosen = PRESETS[preset]
        ctx = click.get_current_context()
        given = {name for name in ctx.params if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
        for name, value in chosen["options"].items():
            if name not in given:
                kw[name] = value
        group_size = kw.pop("group_size", group_size)
        if "gen_length" not in given:
            lengths = list(chosen["gen_lengths"])
        if "steps" not in given:
            steps_of = chosen["steps"]
        kw["baseline_overrides"] = chosen["baseline"] + tuple(kw["baseline_overrides"])
        kw["accelerated_overrides"] = chosen["accelerated"] + tuple(kw["accelerated_overrides"])
    if group_size <= 0 or kw["batch"] % group_size:
        raise BenchError(f"--group-size ({group_size}) must be positive and divide --batch ({kw['batch']})")
    if micro_batch < 0:
        raise BenchError(f"--micro-batch must be >= 0, got {micro_batch}")
    if lr <= 0:
        raise BenchError(f"--lr must be positive, got {lr}")
    if warmup < 0:
        raise BenchError(f"--warmup must be >= 0, got {warmup}")
    requested = {}
    for side, text in (("baseline", baseline_train), ("accelerated", accelerated_train)):
        parts = [t.strip() for t in text.split(",")]
        if len(parts) != 2:
            raise BenchError(f"--{side}-train takes ATTENTION,CE (e.g. padded,naive), got {text!r}")
        requested[side] = tuple(parts)
    dare = get_dare()

    def at_length(gen_length: int) -> dict[str, Any]:
        return {**kw, "gen_length": gen_length, "steps": steps_of(gen_length) if steps_of else kw["steps"]}

    for gen_length in lengths[1:]:  # every length's one-line errors before any work
        if gen_length % kw["block_length"]:
            raise BenchError(f"--gen-length ({gen_length}) must be a multiple of --block-length ({kw['block_length']})")
    setup = build(dare, at_length(lengths[0]))
    # every prompt batch becomes batch // group_size prompts, each repeated group_size times
    grouped = []
    for pid, pmask, examples in setup.prompts:
        n = max(1, pid.shape[0] // group_size)
        grouped.append(
            (
                pid[:n].repeat_interleave(group_size, 0),
                pmask[:n].repeat_interleave(group_size, 0),
                None if examples is None else [ex for ex in examples[:n] for _ in range(group_size)],
            )
        )
    setup = attrs.evolve(setup, prompts=grouped)
    wrapper = setup.wrapper
    micro = micro_batch or kw["batch"]
    lookup = ComponentLookup(dare.registries)
    engine = _engine(wrapper, lr)
    weights = copy.deepcopy(wrapper.module.state_dict())
    opt_state = copy.deepcopy(engine.optimizer.state_dict())

    from dare_core.api import select_training_paths

    try:
        paths = {side: select_training_paths(wrapper, *req, device=setup.device) for side, req in requested.items()}
    except DareError as exc:
        raise BenchError(f"{exc} (set with --baseline-train / --accelerated-train)") from None
    paths["cached"] = paths["accelerated"]

    def restore(name: str) -> None:
        wrapper.module.load_state_dict(weights)
        engine.optimizer.load_state_dict(opt_state)
        if name:
            wrapper.train_attention = paths[name].attention
            wrapper.fused_ce = paths[name].fused_ce

    runs_out = []
    for gen_length in lengths:
        args = at_length(gen_length)
        common = {
            "gen_length": gen_length,
            "block_length": args["block_length"],
            "steps": args["steps"] or gen_length,
            "temperature": args["temperature"],
        }
        specs = (
            setup.specs
            if gen_length == lengths[0]
            else {
                "baseline": rollout_config(
                    dare, "baseline", args["baseline_backend"], common, args["baseline_overrides"]
                ),
                "accelerated": rollout_config(
                    dare,
                    "accelerated",
                    args["accelerated_backend"],
                    common,
                    args["accelerated_overrides"],
                    ACCELERATED_DEFAULTS,
                ),
            }
        )
        specs = graphs_twin(specs, setup.device)
        backends = {side: spec.build(cfg) for side, (spec, cfg) in specs.items()}
        for side, (spec, cfg) in specs.items():
            click.echo(f"gen {gen_length} {side}: {spec.name} {config_text(cfg)}; {paths[side].describe()}")
        runs = {
            side: (lambda b=b: _rl_step(setup, b, lookup, engine, group_size, micro, kw["seed"]))
            for side, b in backends.items()
        }
        if warmup:
            interleave(runs, warmup, setup.device, prepare=restore)
        results = interleave(runs, kw["repeats"], setup.device, progress=click.echo, prepare=restore)
        restore("")
        summary = {side: _summarise(rs) for side, rs in results.items()}
        runs_out.append((gen_length, specs, summary, _ratios(summary)))

    click.echo("")
    print_table(
        [
            "gen",
            "config",
            "backend",
            "s/step",
            "cpu-s/step",
            "rollout s",
            "log-prob s",
            "update s",
            "rollout tok/s",
            "nfe",
            f"peak MB ({runs_out[0][2]['baseline']['memory_kind']})",
        ],
        [
            [
                gen_length,
                _label(side),
                specs[side][0].name,
                s["step_time_s"],
                s["step_cpu_s"],
                s["rollout_s"],
                s["logprob_s"],
                s["update_s"],
                s["rollout_tokens_per_s"],
                s["nfe_per_step"],
                s["peak_memory_mb"],
            ]
            for gen_length, specs, summary, _ in runs_out
            for side, s in summary.items()
        ],
    )
    names = list(runs_out[0][3])
    click.echo("")
    print_table(
        ["ratio"] + [f"gen {g}" for g, *_ in runs_out], [[name] + [r.get(name) for *_, r in runs_out] for name in names]
    )
    for gen_length, _, _, r in runs_out:
        extra = (
            f"; cached without graphs {r['step_speedup_cached']}x, graphs {r['graphs_speedup']}x over it"
            if "graphs_speedup" in r
            else ""
        )
        click.echo(
            f"gen {gen_length}: RL step speed-up {r['step_speedup']}x wall, "
            f"{r['step_cpu_speedup']}x CPU time (rollout {r['rollout_speedup']}x wall){extra}"
        )
    payload: dict[str, Any] = {
        "bench": "rl",
        "preset": preset,
        "model": {
            "source": setup.source,
            "family": wrapper.family,
            "parameters": sum(p.numel() for p in wrapper.module.parameters()),
            "dtype": kw["dtype"],
        },
        "setup": {
            "batch": kw["batch"],
            "group_size": group_size,
            "micro_batch": micro,
            "gen_length": lengths if len(lengths) > 1 else lengths[0],
            "block_length": kw["block_length"],
            "task": kw["task"],
            "repeats": kw["repeats"],
            "warmup": warmup,
            "lr": lr,
            "seed": kw["seed"],
        },
    }
    for gen_length, specs, summary, r in runs_out:
        part = {
            "configs": {
                side: {"backend": spec.name, "config": config_text(cfg), "training_paths": paths[side].as_dict()}
                for side, (spec, cfg) in specs.items()
            },
            **{_label(side): s for side, s in summary.items()},
            "ratios": r,
        }
        if len(lengths) == 1:
            payload.update(part)
        else:
            payload.setdefault("lengths", []).append({"gen_length": gen_length, **part})
    if len(lengths) > 1:
        payload["ratios"] = {str(g): r for g, *_, r in runs_out}
    payload["machine"] = machine_info(setup.device)
    emit_json(payload)


def _label(side: str) -> str:
    return "eager" if side == "baseline" else side


def _summarise(rs: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rs)
    return {
        "step_time_s": round(sum(r["seconds"] for r in rs) / n, 4),
        "step_cpu_s": round(sum(r["cpu_seconds"] for r in rs) / n, 4),
        "rollout_s": round(sum(r["rollout_s"] for r in rs) / n, 4),
        "logprob_s": round(sum(r["logprob_s"] for r in rs) / n, 4),
        "update_s": round(sum(r["update_s"] for r in rs) / n, 4),
        "rollout_tokens_per_s": round(sum(r["tokens"] for r in rs) / max(1e-9, sum(r["rollout_s"] for r in rs)), 3),
        "nfe_per_step": rs[0]["nfe"],
        "peak_memory_mb": round(max(r["peak_memory_bytes"] for r in rs) / 2**20, 1),
        "memory_kind": rs[0]["memory_kind"],
        "seconds_each": [round(r["seconds"], 3) for r in rs],
    }


def _ratios(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Speed-ups of the accelerated side over the eager one (and, with a cached side, of that
    side over eager and of the accelerated side over it: the gain of the static steps)."""
    e, a = summary["baseline"], summary["accelerated"]
    out = {
        "step_speedup": ratio(e["step_time_s"], a["step_time_s"]),
        "step_cpu_speedup": ratio(e["step_cpu_s"], a["step_cpu_s"]),
        "rollout_speedup": ratio(e["rollout_s"], a["rollout_s"]),
        "peak_memory": ratio(a["peak_memory_mb"], e["peak_memory_mb"]),
    }
    if "cached" in summary:
        c = summary["cached"]
        out.update(
            step_speedup_cached=ratio(e["step_time_s"], c["step_time_s"]),
            rollout_speedup_cached=ratio(e["rollout_s"], c["rollout_s"]),
            graphs_speedup=ratio(c["step_time_s"], a["step_time_s"]),
            graphs_rollout_speedup=ratio(c["rollout_s"], a["rollout_s"]),
        )
    return out
