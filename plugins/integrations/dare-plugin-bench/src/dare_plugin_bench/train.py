"""``dare bench train``: the training-side accelerations against their baselines.

Two parts, each interleaved baseline / accelerated in one run (A, B, A, B, ...):

* **packing** — one training step (forward and backward of the masked-diffusion NELBO,
  ``Σ -log p / p_mask`` over masked tokens / #masked, the same corruption on both sides) on a
  batch whose responses are spread evenly over ``--min-response``..``--max-response`` tokens
  after ragged prompts: ``padded`` rows against ``packed`` rows (document masks, per-document
  positions; a block family packs each document's ``[noisy | clean]`` BD3LM layout). Reported:
  valid tokens per second, step time, peak memory, the model input shape of each side (what the
  first decoder layer receives) and the relative difference of the two losses and gradients.
* **cross entropy** — ``Σ_n -log p_n / p_mask_n`` from hidden states ``[N, D]`` and a head
  ``[V, D]`` (defaults: N 4096, V 126,464), forward and backward: the naive form (full
  ``[N, V]`` logits, float32 log-softmax) against the chunked logits-free one. Reported: time,
  peak memory *above the inputs* (CPU: peak resident set size minus the resident size before the
  call; CUDA: ``max_memory_allocated`` minus the allocated memory before), and the relative
  difference of loss and gradients (hidden and weight).

* **moe** (``--part moe`` only) — forward and backward of one SDAR-MoE sparse block (softmax
  top-k router, SwiGLU experts; the block of a one-layer random ``sdar_moe`` checkpoint that the
  registered ``sdar`` family creates and loads) on ``--moe-tokens`` random tokens, for each
  ``--moe-experts`` count: the per-expert ``loop`` against the ``grouped`` experts
  (:mod:`dare_nn.moe`). Reported:
  time, peak memory, the loop/grouped time ratio and the relative difference of the output and
  the gradients (input, router and expert weights).

A table per part, then one JSON line with ratios and machine info. Run as ``dare bench train
...`` or ``python -m dare_plugin_bench.train ...``.
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import torch

from dare_plugin_bench.common import (
    BenchError,
    PeakMemory,
    create_checkpoint,
    emit_json,
    machine_info,
    prepare_model,
    print_table,
    random_prompts,
    ratio,
    sync,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PACKED_TARGET = 1.5  # packed tokens/s over padded
MEMORY_TARGET = 0.30  # fused peak memory / naive peak memory
EQUAL_TARGET = 1e-5  # relative difference of loss and gradients
#: the family whose MoE architecture ``--part moe`` times, and its MoE ``model_type``
MOE_FAMILY, MOE_MODEL_TYPE = "sdar", "sdar_moe"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dare bench train", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--part",
        choices=("all", "packing", "ce", "moe"),
        default="all",
        help="Which comparison to run (default: all = packing and ce).",
    )
    p.add_argument(
        "--model", dest="family", default=None, help="Model family for the packing part (see `dare list models`)."
    )
    p.add_argument("--checkpoint", default=None, help="Checkpoint directory (default: the family's bundled one).")
    p.add_argument(
        "--random",
        dest="random_model",
        action="store_true",
        help="Use a randomly initialised checkpoint of the family's architecture (sizes from --size).",
    )
    p.add_argument(
        "--size",
        dest="sizes",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Architecture field of the --random model, e.g. d_model=256 (repeatable).",
    )
    p.add_argument("--tokenizer-task", default="sudoku", help="Task whose texts train the --random tokenizer.")
    p.add_argument("--batch", type=int, default=8, help="Packing: sequences per step (default 8).")
    p.add_argument("--prompt-length", type=int, default=64, help="Packing: longest prompt (default 64).")
    p.add_argument(
        "--ragged",
        type=int,
        default=7,
        help="Packing: prompt of row i is left padded by (i * RAGGED) %% prompt-length (default 7).",
    )
    p.add_argument("--min-response", type=int, default=32, help="Packing: shortest response (default 32).")
    p.add_argument("--max-response", type=int, default=512, help="Packing: longest response (default 512).")
    p.add_argument(
        "--pack-cross-entropy",
        choices=("naive", "fused"),
        default="naive",
        help="Packing: cross entropy used on both sides (default naive, to isolate the attention path).",
    )
    p.add_argument(
        "--kernels",
        default="auto",
        help="Packing: packed-attention kernel(s) to run against padded: auto (the one "
        "training picks), all (every one the device and dtype run), or a comma list "
        "of sdpa_mask, flex, varlen, flash_attn (default auto).",
    )
    p.add_argument("--tokens", type=int, default=4096, help="CE: hidden rows N (default 4096).")
    p.add_argument("--vocab", type=int, default=126464, help="CE: vocabulary V (default 126464).")
    p.add_argument("--hidden", type=int, default=256, help="CE: hidden size D (default 256).")
    p.add_argument(
        "--ce-dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="CE: dtype of hidden states and head (default float32).",
    )
    p.add_argument("--chunk", type=int, default=0, help="CE: rows per chunk (0 = from the 2**24-logit budget).")
    p.add_argument("--moe-tokens", type=int, default=512, help="MoE: tokens through the block (default 512).")
    p.add_argument("--moe-hidden", type=int, default=256, help="MoE: hidden size (default 256).")
    p.add_argument("--moe-intermediate", type=int, default=128, help="MoE: expert width (default 128).")
    p.add_argument("--moe-experts", default="16,64", help="MoE: comma list of expert counts (default 16,64).")
    p.add_argument("--moe-top-k", type=int, default=8, help="MoE: experts per token (default 8).")
    p.add_argument("--moe-dtype", choices=sorted(DTYPES), default="float32", help="MoE: block dtype.")
    p.add_argument("--repeats", type=int, default=3, help="Timed runs per side, interleaved (default 3).")
    p.add_argument("--warmup", type=int, default=1, help="Untimed runs per side first (default 1).")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="Packing: model dtype.")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu).")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default).")
    p.add_argument("--seed", type=int, default=0)
    return p


def _validate(a: argparse.Namespace) -> None:
    for key in (
        "batch",
        "prompt_length",
        "min_response",
        "max_response",
        "tokens",
        "vocab",
        "hidden",
        "repeats",
        "moe_tokens",
        "moe_hidden",
        "moe_intermediate",
        "moe_top_k",
    ):
        if getattr(a, key) <= 0:
            raise BenchError(f"--{key.replace('_', '-')} must be positive, got {getattr(a, key)}")
    for key in ("ragged", "chunk", "warmup", "threads"):
        if getattr(a, key) < 0:
            raise BenchError(f"--{key.replace('_', '-')} must be >= 0, got {getattr(a, key)}")
    if a.min_response > a.max_response:
        raise BenchError(f"--min-response ({a.min_response}) must not exceed --max-response ({a.max_response})")
    if a.part in ("all", "packing") and not a.family:
        raise BenchError("the packing part needs a model: pass --model NAME (or --part ce)")
    if a.checkpoint and a.random_model:
        raise BenchError("pass either --checkpoint or --random, not both")
    if a.sizes and not a.random_model:
        raise BenchError("--size only applies to --random models; add --random")
    counts = a.moe_experts.replace(",", " ").split()
    if not counts or not all(c.isdigit() and int(c) >= a.moe_top_k for c in counts):
        raise BenchError(
            f"--moe-experts must be a comma list of expert counts >= --moe-top-k ({a.moe_top_k}), got {a.moe_experts!r}"
        )
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {a.device} but no CUDA device is available; use --device cpu")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double().to(a.device)
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            m = re.search(r"VmRSS:\s+(\d+)\s+kB", fh.read())
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


def _return_freed_memory() -> bool:
    """Make glibc serve allocations of 128 KiB and more with ``mmap`` (fixed threshold, so freed
    tensors leave the resident set at once), so that resident-set peaks measure live tensors
    rather than reused heap. Returns False where that is not possible (not glibc)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 128 * 1024) == 1
        return ok and libc.mallopt(m_trim_threshold, 128 * 1024) == 1
    except (OSError, AttributeError):
        return False


def _measure(fn, device: str) -> tuple[Any, float, float, int, int, str]:
    """``(result, wall seconds, process CPU seconds, peak bytes, peak bytes above the state
    before, memory kind)``."""
    gc.collect()
    sync(device)
    cuda = device.startswith("cuda")
    before = int(torch.cuda.memory_allocated()) if cuda else _rss_bytes()
    with PeakMemory(device) as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        sync(device)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return out, seconds, cpu, mem.peak, max(0, mem.peak - before), mem.kind


def _interleaved(sides: dict[str, Any], repeats: int, warmup: int, device: str) -> dict[str, list[dict]]:
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    out: dict[str, list[dict]] = {name: [] for name in sides}
    for rep in range(repeats):
        for name, fn in sides.items():
            if out[name]:  # keep tensors of the last run only (memory is measured per run)
                out[name][-1]["result"] = {"loss": out[name][-1]["result"]["loss"]}
            result, seconds, cpu, peak, delta, kind = _measure(fn, device)
            out[name].append(
                {"result": result, "seconds": seconds, "cpu": cpu, "peak": peak, "delta": delta, "kind": kind}
            )
            print(f"[{rep + 1}/{repeats}] {name}: {seconds:.3f} s wall, {cpu:.3f} s cpu", file=sys.stderr, flush=True)
    return out


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


# --------------------------------------------------------------------------- packing
def _training_batch(wrapper: Any, a: argparse.Namespace):
    from dare_core.api import SequenceBatch

    b = a.batch
    prompt_ids, prompt_mask = random_prompts(wrapper, b, a.prompt_length, a.seed, a.ragged)
    lengths = torch.linspace(a.min_response, a.max_response, b).round().long()
    lengths = lengths[torch.randperm(b, generator=torch.Generator().manual_seed(a.seed + 1))]
    width = int(lengths.max())
    resp, _ = random_prompts(wrapper, b, width, a.seed + 2)
    rmask = torch.zeros(b, width, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        resp[i, n:] = wrapper.pad_token_id
        rmask[i, :n] = 1
    batch = SequenceBatch(torch.cat([prompt_ids, resp], 1), torch.cat([prompt_mask, rmask], 1), prompt_ids.shape[1])
    return batch.to(a.device), lengths


def _nelbo_step(wrapper: Any, batch: Any, corrupted: Any) -> dict[str, Any]:
    from dare_core.api import MaskedTokenLogProb

    params = [p for p in wrapper.module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    logp = MaskedTokenLogProb()(wrapper, batch, corrupted)
    weight = torch.where(corrupted.masked, 1.0 / corrupted.p_mask.clamp_min(1e-12), torch.zeros((), device=logp.device))
    loss = (-logp * weight).sum() / corrupted.masked.sum().clamp_min(1)
    loss.backward()
    # kept on the device: a copy to the host would dominate a GPU step (4 GB for a 1B model)
    grads = torch.cat([p.grad.detach().reshape(-1) for p in params if p.grad is not None])
    return {"loss": float(loss.detach()), "grads": grads}


def run_packing(a: argparse.Namespace, dare: Any) -> dict[str, Any]:
    from dare_core.api import RandomRatioMasking, configure_training_paths, parse_overrides, plan_packing

    sizes = None
    if a.random_model:
        sizes, problems = parse_overrides(a.sizes)
        if problems:
            raise BenchError("; ".join(problems))
    wrapper, source = prepare_model(
        dare,
        a.family,
        checkpoint=a.checkpoint,
        random_sizes=sizes,
        tokenizer_task=a.tokenizer_task,
        dtype=DTYPES[a.dtype],
        device=a.device,
        seed=a.seed,
    )
    wrapper.module.train()
    batch, lengths = _training_batch(wrapper, a)
    corrupted = RandomRatioMasking(mc_num=1)(wrapper, batch, torch.Generator().manual_seed(a.seed + 3))
    plan = plan_packing(batch.attention_mask.cpu())
    valid = int(batch.attention_mask.sum())
    padded_slots = batch.input_ids.numel()
    paths, shapes, current = {}, {}, [""]
    kernels = _packed_kernels(a, wrapper)
    layers = wrapper.decoder_layers()

    def record(_mod, args, kwargs):  # the [rows, width] each side's forward runs on
        x = next(t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))
        shapes.setdefault(current[0], list(x.shape[:2]))

    if layers:
        layers[0].register_forward_pre_hook(record, with_kwargs=True)
    shapes.update({} if layers else {"padded": list(batch.input_ids.shape), "packed": [plan.rows, plan.width]})

    def side(name: str, attention: str, kernel: str = "auto"):
        def fn():
            paths[name] = configure_training_paths(
                wrapper, attention, a.pack_cross_entropy, a.device, attention_kernel=kernel
            ).describe()
            current[0] = name
            return _nelbo_step(wrapper, batch, corrupted)

        return fn

    sides = {"padded": side("padded", "padded")}
    names = {k: ("packed" if i == 0 else f"packed:{k}") for i, k in enumerate(kernels)}
    for k, name in names.items():
        sides[name] = side(name, "packed", k)
    runs = _interleaved(sides, a.repeats, a.warmup, a.device)
    rows, out = [], {}
    for name, rs in runs.items():
        t = _median([r["seconds"] for r in rs])
        c = _median([r["cpu"] for r in rs])
        out[name] = {
            "step_time_s": round(t, 4),
            "step_time_s_each": [round(r["seconds"], 4) for r in rs],
            "tokens_per_s": round(valid / t, 1),
            "cpu_s": round(c, 4),
            "tokens_per_cpu_s": round(valid / c, 1) if c else None,
            "peak_memory_mb": round(max(r["peak"] for r in rs) / 2**20, 1),
            "memory_kind": rs[0]["kind"],
            "loss": rs[-1]["result"]["loss"],
            "path": paths[name],
        }
        rows.append(
            (
                name,
                f"{t:.3f}",
                f"{valid / t:.0f}",
                f"{c:.3f}",
                f"{out[name]['peak_memory_mb']:.0f}",
                f"{out[name]['loss']:.6f}",
            )
        )
    for k, name in names.items():
        o = out[name]
        o["kernel"] = k
        o["loss_rel_diff"] = abs(o["loss"] - out["padded"]["loss"]) / abs(out["padded"]["loss"])
        o["grad_rel_diff"] = _rel(runs[name][-1]["result"]["grads"], runs["padded"][-1]["result"]["grads"])
        o["over_padded_tokens_per_s"] = ratio(o["tokens_per_s"], out["padded"]["tokens_per_s"])
    loss_rel, grad_rel = out["packed"]["loss_rel_diff"], out["packed"]["grad_rel_diff"]
    speedup = ratio(out["packed"]["tokens_per_s"], out["padded"]["tokens_per_s"])
    cpu_speedup = ratio(out["padded"]["cpu_s"], out["packed"]["cpu_s"])
    (pr, pw), (kr, kw) = shapes["padded"], shapes["packed"]
    print(
        f"\npacking: {a.batch} sequences, prompts <= {a.prompt_length} (ragged {a.ragged}), responses "
        f"{a.min_response}-{a.max_response}; model {source}; {valid} valid tokens in "
        f"{tuple(batch.input_ids.shape)} = {padded_slots} slots; model input padded {pr}x{pw} = "
        f"{pr * pw} slots, packed {kr}x{kw} = {kr * kw} slots; cross entropy {a.pack_cross_entropy} "
        f"on both sides"
    )
    print_table(("attention", "step s (median)", "valid tok/s", "cpu s (median)", "peak MB", "loss"), rows)
    print(
        f"packed ({kernels[0]})/padded tokens/s = {speedup}x (wall), {cpu_speedup}x (process CPU time); "
        f"loss rel. diff {loss_rel:.2e}, gradient rel. diff {grad_rel:.2e}"
    )
    for k, name in list(names.items())[1:]:
        o = out[name]
        print(
            f"packed ({k})/padded tokens/s = {o['over_padded_tokens_per_s']}x; loss rel. diff "
            f"{o['loss_rel_diff']:.2e}, gradient rel. diff {o['grad_rel_diff']:.2e}"
        )
    return {
        "model": source,
        "batch": a.batch,
        "response_lengths": lengths.tolist(),
        "valid_tokens": valid,
        "padded_shape": list(batch.input_ids.shape),
        "packed_shape": shapes["packed"],
        "padded_input_shape": shapes["padded"],
        "cross_entropy": a.pack_cross_entropy,
        "padded": out["padded"],
        "packed": out["packed"],
        "packed_other_kernels": {k: out[name] for k, name in list(names.items())[1:]},
        "packed_over_padded_tokens_per_s": speedup,
        "packed_over_padded_tokens_per_cpu_s": cpu_speedup,
        "loss_rel_diff": loss_rel,
        "grad_rel_diff": grad_rel,
        "target_met": bool(speedup is not None and speedup >= PACKED_TARGET and loss_rel <= EQUAL_TARGET),
    }


def _packed_kernels(a: argparse.Namespace, wrapper: Any) -> list[str]:
    """The packed-attention kernels of ``--kernels``, the one training would pick first."""
    from dare_core.api import available_kernels, param_dtype, select_training_paths

    dtype = param_dtype(wrapper)
    runnable = list(available_kernels(a.device, dtype))
    auto = select_training_paths(wrapper, "packed", a.pack_cross_entropy, a.device).attention_kernel
    if a.kernels == "auto":
        return [auto]
    if a.kernels == "all":
        return [auto] + [k for k in runnable if k != auto]
    wanted = [k.strip() for k in a.kernels.split(",") if k.strip()]
    bad = [k for k in wanted if k not in runnable]
    if bad or not wanted:
        raise BenchError(
            f"--kernels {a.kernels}: {', '.join(bad) or 'none given'} cannot run on {a.device} with "
            f"{str(dtype).replace('torch.', '')} weights; runnable: {', '.join(runnable)} (or auto, all)"
        )
    return list(dict.fromkeys(wanted))


# --------------------------------------------------------------------------- cross entropy
def run_ce(a: argparse.Namespace) -> dict[str, Any]:
    from dare_core.api import (
        DEFAULT_CHUNK_ELEMENTS,
        chunk_rows,
        fused_token_logprobs,
        naive_token_logprobs,
    )

    dtype = DTYPES[a.ce_dtype]
    g = torch.Generator().manual_seed(a.seed)
    hidden = torch.randn(a.tokens, a.hidden, generator=g).to(dtype).to(a.device)
    weight = (torch.randn(a.vocab, a.hidden, generator=g) / a.hidden**0.5).to(dtype).to(a.device)
    targets = torch.randint(0, a.vocab, (a.tokens,), generator=g).to(a.device)
    p_mask = (torch.rand(a.tokens, generator=g) * 0.999 + 1e-3).to(a.device)
    chunk = a.chunk or chunk_rows(a.vocab, DEFAULT_CHUNK_ELEMENTS)

    def side(fn):
        def run():
            h = hidden.detach().requires_grad_(True)
            w = weight.detach().requires_grad_(True)
            logp = fn(h, w)
            loss = (-logp / p_mask).sum()
            loss.backward()
            return {"loss": loss.detach(), "grad_h": h.grad, "grad_w": w.grad}

        return run

    naive = side(lambda h, w: naive_token_logprobs(h, w, targets))
    fused = side(lambda h, w: fused_token_logprobs(h, w, targets, chunk=chunk))
    runs = _interleaved({"naive": naive, "fused": fused}, a.repeats, a.warmup, a.device)
    rows, out = [], {}
    for name, rs in runs.items():
        t = _median([r["seconds"] for r in rs])
        out[name] = {
            "seconds": round(t, 4),
            "cpu_s": round(_median([r["cpu"] for r in rs]), 4),
            "seconds_each": [round(r["seconds"], 4) for r in rs],
            "tokens_per_s": round(a.tokens / t, 1),
            "peak_memory_mb": round(max(r["peak"] for r in rs) / 2**20, 1),
            "peak_above_inputs_mb": round(max(r["delta"] for r in rs) / 2**20, 1),
            "memory_kind": rs[0]["kind"],
            "loss": float(rs[-1]["result"]["loss"]),
        }
        rows.append(
            (
                name,
                f"{t:.3f}",
                f"{out[name]['peak_above_inputs_mb']:.0f}",
                f"{out[name]['peak_memory_mb']:.0f}",
                f"{out[name]['loss']:.6f}",
            )
        )
    rn, rf = runs["naive"][-1]["result"], runs["fused"][-1]["result"]
    diffs = {
        "loss": _rel(rf["loss"], rn["loss"]),
        "grad_hidden": _rel(rf["grad_h"], rn["grad_h"]),
        "grad_weight": _rel(rf["grad_w"], rn["grad_w"]),
    }
    reference = None
    if dtype != torch.float32:
        # where does each side's low-precision rounding leave it? float64 on the same (rounded)
        # inputs, chunked so that it fits; logits are not rounded here
        ref = side(lambda h, w: fused_token_logprobs(h.double(), w.double(), targets, chunk=chunk))()
        reference = {
            f"{name}_{key}": _rel(res[key].double(), ref[key].double())
            for name, res in (("naive", rn), ("fused", rf))
            for key in ("loss", "grad_h", "grad_w")
        }
        del ref
    mem = ratio(out["fused"]["peak_above_inputs_mb"], out["naive"]["peak_above_inputs_mb"])
    logits_mb = a.tokens * a.vocab * 4 / 2**20
    print(
        f"\ncross entropy: N={a.tokens} V={a.vocab} D={a.hidden} {a.ce_dtype}, chunk {chunk} rows "
        f"({chunk * a.vocab * 4 / 2**20:.0f} MiB of float32 logits; full logits would be {logits_mb:.0f} MiB); "
        f"forward + backward of sum(-log p / p_mask)"
    )
    print_table(("head", "s (median)", "peak above inputs MB", "peak MB", "loss"), rows)
    print(
        f"fused/naive peak memory = {mem}; rel. diff loss {diffs['loss']:.2e}, grad hidden "
        f"{diffs['grad_hidden']:.2e}, grad weight {diffs['grad_weight']:.2e}"
    )
    if reference is not None:
        print(
            "rel. diff to a float64 reference on the same inputs: "
            + ", ".join(f"{k} {v:.2e}" for k, v in reference.items())
        )
    return {
        "tokens": a.tokens,
        "vocab": a.vocab,
        "hidden": a.hidden,
        "dtype": a.ce_dtype,
        "chunk_rows": chunk,
        "naive": out["naive"],
        "fused": out["fused"],
        "fused_over_naive_peak_memory": mem,
        "fused_over_naive_time": ratio(out["fused"]["seconds"], out["naive"]["seconds"]),
        "rel_diff": diffs,
        "rel_diff_to_float64": reference,
        "target_met": bool(mem is not None and mem <= MEMORY_TARGET and max(diffs.values()) <= EQUAL_TARGET),
    }


# --------------------------------------------------------------------------- MoE experts
def _moe_block(a: argparse.Namespace, dare: Any, experts: int) -> torch.nn.Module:
    """The MoE block (a :class:`dare_nn.moe.GroupedExperts`) of a one-layer random SDAR-MoE
    model with ``experts`` experts, written and loaded by the registered ``sdar`` family (its
    ``create`` and ``load``), on ``a.device`` in the ``--moe-dtype``."""
    from dare_nn import moe

    if MOE_FAMILY not in dare.registries.models:
        raise BenchError(f"--part moe times the MoE block of the {MOE_FAMILY} family: install dare-plugin-sdar")
    sizes = {
        "model_type": MOE_MODEL_TYPE,
        "num_hidden_layers": 1,
        "hidden_size": a.moe_hidden,
        "num_experts": experts,
        "num_experts_per_tok": a.moe_top_k,
        "moe_intermediate_size": a.moe_intermediate,
    }
    family = dare.registries.models.get(MOE_FAMILY)
    with tempfile.TemporaryDirectory(prefix="dare-bench-moe-") as tmp:
        create_checkpoint(dare, MOE_FAMILY, tmp, sizes, a.tokenizer_task, a.seed)
        module = family.load(tmp, dtype=torch.float32, device="cpu").module
    block = next((m for m in module.modules() if isinstance(m, moe.GroupedExperts)), None)
    if block is None:
        raise BenchError(f"the {MOE_MODEL_TYPE} model of the {MOE_FAMILY} family has no dare_nn.moe block to time")
    return block.to(device=a.device, dtype=DTYPES[a.moe_dtype])


def run_moe(a: argparse.Namespace, dare: Any) -> dict[str, Any]:
    from dare_nn import moe

    dtype, out, rows = DTYPES[a.moe_dtype], {}, []
    for n_exp in [int(c) for c in a.moe_experts.replace(",", " ").split()]:
        block = _moe_block(a, dare, n_exp)
        g = torch.Generator().manual_seed(a.seed + 1)
        x, probe = (torch.randn(1, a.moe_tokens, a.moe_hidden, generator=g).to(a.device, dtype) for _ in range(2))

        def side(impl: str, block: torch.nn.Module = block, x: torch.Tensor = x, probe: torch.Tensor = probe):
            def fn():
                block.experts_impl = impl
                block.zero_grad(set_to_none=True)
                h = x.detach().requires_grad_(True)
                y = block(h)
                y = y[0] if isinstance(y, tuple) else y  # (output, router logits) of SDAR's block
                loss = (y.float() * probe).sum()
                loss.backward()
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in block.parameters()]
                return {
                    "loss": loss.detach(),
                    "out": y.detach(),
                    "grad_x": h.grad,
                    "grads": torch.cat([q.reshape(-1) for q in grads]),
                }

            return fn

        runs = _interleaved({"loop": side("loop"), "grouped": side("grouped")}, a.repeats, a.warmup, a.device)
        res = {
            name: {
                "seconds": round(_median([r["seconds"] for r in rs]), 4),
                "cpu_s": round(_median([r["cpu"] for r in rs]), 4),
                "seconds_each": [round(r["seconds"], 4) for r in rs],
                "peak_memory_mb": round(max(r["peak"] for r in rs) / 2**20, 1),
            }
            for name, rs in runs.items()
        }
        rl, rg = runs["loop"][-1]["result"], runs["grouped"][-1]["result"]
        res["rel_diff"] = {k: _rel(rg[k], rl[k]) for k in ("out", "grad_x", "grads")}
        res["loop_over_grouped_time"] = ratio(res["loop"]["seconds"], res["grouped"]["seconds"])
        res["loop_over_grouped_cpu_time"] = ratio(res["loop"]["cpu_s"], res["grouped"]["cpu_s"])
        res["grouped_kernel"] = moe.auto_kernel(x, n_exp, 2 * a.moe_intermediate, a.moe_hidden)
        out[str(n_exp)] = res
        rows.append(
            (
                n_exp,
                f"{res['loop']['seconds']:.4f}",
                f"{res['grouped']['seconds']:.4f}",
                f"{res['loop_over_grouped_time']}x",
                f"{res['loop_over_grouped_cpu_time']}x",
                f"{res['loop']['peak_memory_mb']:.0f}",
                f"{res['grouped']['peak_memory_mb']:.0f}",
                f"{max(res['rel_diff'].values()):.1e}",
            )
        )
        del block, runs, rl, rg
    print(
        f"\nMoE experts: one SDAR-MoE block, {a.moe_tokens} tokens, hidden {a.moe_hidden}, expert width "
        f"{a.moe_intermediate}, top-{a.moe_top_k}, {a.moe_dtype}, forward + backward; grouped kernel "
        f"{next(iter(out.values()))['grouped_kernel']}"
    )
    print_table(
        (
            "experts",
            "loop s",
            "grouped s",
            "loop/grouped",
            "cpu loop/grouped",
            "loop peak MB",
            "grouped peak MB",
            "max rel. diff",
        ),
        rows,
    )
    return {
        "tokens": a.moe_tokens,
        "hidden": a.moe_hidden,
        "intermediate": a.moe_intermediate,
        "top_k": a.moe_top_k,
        "dtype": a.moe_dtype,
        "by_experts": out,
    }


def main(args: Optional[list[str]] = None, dare: Any = None) -> int:
    """Entry point of ``dare bench train`` (raises :class:`BenchError` on bad arguments);
    ``dare`` is the plugin manager (default: the installed plugins)."""
    a = _parser().parse_args(list(sys.argv[1:] if args is None else args))
    _validate(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    payload: dict[str, Any] = {"bench": "train", "argv": list(sys.argv[1:] if args is None else args)}
    if not a.device.startswith("cuda"):
        payload["malloc_mmap_threshold_fixed"] = _return_freed_memory()
    ratios: dict[str, Any] = {}
    if dare is None:
        from dare_core.api import get_dare

        dare = get_dare()
    if a.part in ("all", "packing"):
        dare.registries.models.get(a.family)
        payload["packing"] = run_packing(a, dare)
        ratios["packed_over_padded_tokens_per_s"] = payload["packing"]["packed_over_padded_tokens_per_s"]
        ratios["packed_over_padded_tokens_per_cpu_s"] = payload["packing"]["packed_over_padded_tokens_per_cpu_s"]
    if a.part in ("all", "ce"):
        payload["cross_entropy"] = run_ce(a)
        ratios["fused_over_naive_peak_memory"] = payload["cross_entropy"]["fused_over_naive_peak_memory"]
    if a.part == "moe":
        payload["moe"] = run_moe(a, dare)
        ratios["moe_loop_over_grouped_time"] = {
            e: r["loop_over_grouped_time"] for e, r in payload["moe"]["by_experts"].items()
        }
    payload["ratios"] = ratios
    payload["targets"] = {
        "packed_over_padded_tokens_per_s": f">= {PACKED_TARGET}",
        "fused_over_naive_peak_memory": f"<= {MEMORY_TARGET}",
        "rel_diff": f"<= {EQUAL_TARGET}",
    }
    payload["machine"] = machine_info(a.device)
    emit_json(payload)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
