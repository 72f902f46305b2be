#!/usr/bin/env bash
# The prepared GPU check of the engines (docs/engines.md), for the `device` tool, after
# `bash scripts/device/prepare.sh` here:
#   run(command="ONLY='setup nccl_ddp nccl_fsdp nccl_deepspeed init' bash scripts/device/engines.sh",
#       carry=[".device"], timeout_s=560)
#   run(command="ONLY='setup rl_lora sft_fsdp sft_zero3' bash scripts/device/engines.sh", ...)
# (two calls on the warm machine; the random 8B checkpoint stays in /tmp between them)
# Stages, each under its own time limit, in order of value:
#   nccl_*    `torchrun --nproc_per_node=1` of each engine (ddp, fsdp, deepspeed ZeRO-2) on CUDA
#             with nccl: 2 SFT steps of the bundled LLaDA checkpoint, then a resume
#   init      a random checkpoint with LLaDA-8B-Instruct's published architecture (d_model 4096,
#             32 layers, 32 heads, MLP 12288; the vocabulary is the small task tokenizer's)
#   rl_lora   one BGPO step of that model with LoRA (rank 8) under bf16-mixed on fsdp
#   sft_fsdp  one full-parameter SFT step of that model, FSDP2 with CPU offload, bf16-mixed
#   sft_zero3 the same with DeepSpeed ZeRO-3 with optimizer and parameter offload
#   init_bf16 the same architecture stored in bf16, as published checkpoints are
#   load_*    that checkpoint loaded and prepared for training (bf16-mixed: fp32 master weights)
#             by the single-process engine and by fsdp (meta device, shards filled from the
#             safetensors) on one GPU: peak allocated device memory (scripts/device/load_peak.py)
#   (third call: ONLY='setup init_bf16 load_single load_fsdp')
# Each training stage logs its step time (metrics.jsonl) and the peak GPU memory (sampled with
# nvidia-smi every 200 ms); $OUT/summary.txt and logs.tgz are rewritten after every stage.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/device/lib.sh
. scripts/device/lib.sh
TAIL=6 stage setup 150 bash -c setup
command -v dare >/dev/null || { ckpt16=/tmp/dare-llada-8b-random-bf16
[ -d "$ckpt16" ] || TAIL=3 stage init_bf16 360 dare init --model llada --out "$ckpt16" --dtype bfloat16 d_model=4096 \
    n_heads=32 n_kv_heads=32 n_layers=32 mlp_hidden_size=12288
load=(--algo sft --model llada "model.path=$ckpt16" model.device=cuda engine.precision=bf16-mixed)
stage load_single 200 "$py" scripts/device/load_peak.py "${load[@]}"
stage load_fsdp 200 torchrun --nproc_per_node=1 scripts/device/load_peak.py "${load[@]}" engine.name=fsdp
cat "$out/summary.txt"; exit 1; }

measured() {  # measured NAME CMD...: the command with peak GPU memory and step times appended
    local name="$1"
    shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$work/$name.mem" &
    local smi=$!
    "$@"
    local rc=$?
    kill "$smi" 2>/dev/null
    echo "peak GPU memory (MiB): $(sort -n "$work/$name.mem" | tail -n 1)"
    grep -h '"step"' "$work/runs/$name/metrics.jsonl" 2>/dev/null | grep -v '"eval"' | \
        "$py" -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k.startswith('time') or k in ('step', 'loss', 'grad_norm')}) for l in sys.stdin]"
    return $rc
}
export -f measured

tiny=(--algo sft --model llada model.device=cuda trainer.steps=2 trainer.save_every=1 eval.before=false
      eval.after=false progress=false "output_dir=$work/runs")
for engine in ddp fsdp deepspeed; do
    stage "nccl_$engine" 90 bash -c "torchrun --nproc_per_node=1 -m dare_core train ${tiny[*]} \
        engine.name=$engine run_name=nccl_$engine && torchrun --nproc_per_node=1 -m dare_core train \
        ${tiny[*]} engine.name=$engine run_name=nccl_$engine trainer.steps=3 trainer.resume=auto"
done

ckpt=/tmp/dare-llada-8b-random
[ -d "$ckpt" ] || TAIL=3 stage init 240 dare init --model llada --out "$ckpt" d_model=4096 n_heads=32 n_kv_heads=32 \
    n_layers=32 mlp_hidden_size=12288
big=(--model llada "model.path=$ckpt" model.device=cuda engine.precision=bf16-mixed trainer.steps=1
     trainer.batch_size=1 trainer.micro_batch_size=1 eval.before=false eval.after=false progress=false
     trainer.save_final=false "output_dir=$work/runs")
stage rl_lora 150 bash -c 'measured "$@"' _ rl_lora torchrun --nproc_per_node=1 -m dare_core train --algo bgpo "${big[@]}" \
    engine.name=fsdp model.lora.rank=8 trainer.group_size=2 rollout.gen_length=64 run_name=rl_lora
stage sft_fsdp 150 bash -c 'measured "$@"' _ sft_fsdp torchrun --nproc_per_node=1 -m dare_core train --algo sft "${big[@]}" \
    engine.name=fsdp fsdp.cpu_offload=true model.gradient_checkpointing=true run_name=sft_fsdp
stage sft_zero3 150 bash -c 'measured "$@"' _ sft_zero3 torchrun --nproc_per_node=1 -m dare_core train --algo sft "${big[@]}" \
    engine.name=deepspeed deepspeed.zero_stage=3 deepspeed.offload_optimizer=cpu deepspeed.offload_param=cpu \
    model.gradient_checkpointing=true run_name=sft_zero3
cat "$out/summary.txt"
