"""Throughput of the ``vllm`` rollout backend against transformers' own DiffusionGemma ``generate``
on the same random model, on a GPU with vLLM installed (``scripts/device/vllm_check.sh`` runs it).

Both generate ``--gen-length`` tokens after each of ``--batch`` random prompts of
``--prompt-length`` tokens, with the same sampler settings (transformers' DiffusionGemma defaults,
which the backend writes into the export vLLM starts from) and no stop token, so every response has
the full length. Reported: tokens/s of each (best of ``--repeats`` timed calls after one untimed
call; the engine's start is timed separately) and their ratio. The JSON result is rewritten to
``--out`` after every stage and printed as one line, so a run cut short keeps what it measured.

    python scripts/device/vllm_check.py --shape tiny --out tiny.json
    python scripts/device/vllm_check.py --shape 26b-a4b --layers 6 --out 26b.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dare_plugin_vllm.backend import VLLMRollout
from dare_plugin_vllm.checks import SHAPES, CheckpointPolicy, diffusion_gemma_config, random_model
from dare_plugin_vllm.config import VLLMRolloutConfig

DEFAULTS = {"tiny": dict(layers=2, canvas=8), "26b-a4b": dict(layers=6, canvas=256)}


def timed(fn, repeats: int) -> tuple[list[float], object]:
    seconds, out = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--layers", type=int, default=0, help="depth (0: tiny 2, 26b-a4b 6 = one 5:1 attention period)")
    ap.add_argument("--canvas", type=int, default=0, help="canvas_length (0: tiny 8, 26b-a4b 256)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    layers = args.layers or DEFAULTS[args.shape]["layers"]
    canvas = args.canvas or DEFAULTS[args.shape]["canvas"]
    result: dict = {
        "args": vars(args),
        "layers": layers,
        "canvas_length": canvas,
        "device": torch.cuda.get_device_name(0),
    }

    def save() -> None:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
        print(json.dumps(result), flush=True)

    t0 = time.perf_counter()
    model = random_model(
        diffusion_gemma_config(args.shape, canvas_length=canvas, num_layers=layers),
        seed=0,
        dtype=torch.bfloat16,
        device="cuda",
    )
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["build_s"] = time.perf_counter() - t0
    save()
    policy = CheckpointPolicy(model, stop_token_ids=(), pad_token_id=0)  # no stop: full-length responses
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(6, vocab, (args.batch, args.prompt_length), generator=gen).cuda()
    mask = torch.ones_like(ids)

    if not args.skip_transformers:

        def hf():
            with torch.no_grad():
                return model.generate(ids, attention_mask=mask, max_new_tokens=args.gen_length)

        first, _ = timed(hf, 1)
        seconds, out = timed(hf, args.repeats)
        tokens = (out.sequences.shape[1] - args.prompt_length) * args.batch
        result["transformers"] = {
            "first_s": first[0],
            "seconds": seconds,
            "tokens": tokens,
            "tokens_per_s": tokens / min(seconds),
        }
        save()

    backend = VLLMRollout(
        VLLMRolloutConfig(
            gen_length=args.gen_length,
            logprobs=False,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=args.batch,
            max_model_len=args.prompt_length + args.gen_length + canvas,
        )
    )
    try:
        first, _ = timed(lambda: backend.generate(policy, ids, mask, generator=gen), 1)
        result["vllm"] = {"start_and_first_s": first[0]}
        save()
        seconds, out = timed(lambda: backend.generate(policy, ids, mask, generator=gen), args.repeats)
        tokens = int(out.response_mask.sum())
        result["vllm"].update(seconds=seconds, tokens=tokens, tokens_per_s=tokens / min(seconds))
        if "transformers" in result:
            result["vllm_over_transformers"] = result["vllm"]["tokens_per_s"] / result["transformers"]["tokens_per_s"]
        save()
    finally:
        backend.close()


if __name__ == "__main__":
    main()
