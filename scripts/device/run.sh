#!/usr/bin/env bash
# One prepared GPU run (the checks that need CUDA), for the `device` tool, after
# `bash scripts/device/prepare.sh` here:
#   run(command="bash scripts/device/run.sh", carry=[".device"], timeout_s=480)
# Stages, each under its own time limit, in order of value:
#   pytest    the CUDA kernel tests (FlexAttention, varlen_attn, flash-attn if present, fused CE)
#             and every family contract's packed-kernels-vs-padded test on CUDA (fp32 and bf16)
#   init      a ~1B-parameter random LLaDA-shape checkpoint (d 2048, 20 layers, MLP 5632)
#   train_*   `dare bench train` packing (padded vs packed with every kernel, bf16 and fp32) and
#             the fused cross entropy (vocab 126,464, 4,096 tokens, fp32 and bf16)
#   rollout   `dare bench rollout` on the 1B model in bf16 (no-cache reference vs fast)
#   rl        `dare bench rl` on the 1B model in bf16 (eager vs accelerated RL step)
#   e2e       `dare train` for 2 steps on the bundled LLaDA checkpoint on CUDA, fp32 and bf16
#             (which training paths ran is in the run log)
# What comes back under $OUT: summary.txt (each stage's exit code and last lines) and logs.tgz
# (every stage's full log), both rewritten after every stage so a cut-short call keeps what ran.
# Knobs (environment): DARE_DEVICE (cuda; cpu for a dry run here), SIZES (architecture of the
# random model, "k=v k=v"), ONLY (space-separated stage names), BATCH (rollout/RL rows, 8),
# PYTEST_K (the pytest stage's -k expression).
set -uo pipefail
cd "$(dirname "$0")/../.."
sizes="${SIZES:-d_model=2048 n_heads=16 n_kv_heads=16 n_layers=20 mlp_hidden_size=5632}"
batch="${BATCH:-8}"
# shellcheck source=scripts/device/lib.sh
. scripts/device/lib.sh
TAIL=6 stage setup 150 bash -c setup
command -v dare >/dev/null || { cat "$out/summary.txt"; exit 1; }

stage pytest 150 "$py" -m pytest -q -p no:cacheprovider -rs tests/test_cuda_kernels.py \
    plugins/families/dare-plugin-llada/tests/test_contract.py plugins/families/dare-plugin-dream/tests/test_contract.py \
    -k "${PYTEST_K:-cuda_kernels or packed_kernels or fused_cross_entropy or every_kernel or half_precision}"

ckpt="$work/llada-random"
# shellcheck disable=SC2086
TAIL=3 stage init 120 dare init --model llada --out "$ckpt" $sizes
common=(--model llada --checkpoint "$ckpt" --device "$device")
stage train_packing_bf16 100 dare bench train --part packing "${common[@]}" --dtype bfloat16 \
    --kernels all --batch 8 --prompt-length 64 --min-response 32 --max-response 512 --repeats 3
stage train_packing_fp32 100 dare bench train --part packing "${common[@]}" --dtype float32 \
    --kernels all --batch 8 --prompt-length 64 --min-response 32 --max-response 512 --repeats 3
stage train_ce 60 dare bench train --part ce --device "$device" --tokens 4096 --vocab 126464 --hidden 2048 --repeats 3
stage train_ce_bf16 60 dare bench train --part ce --device "$device" --tokens 4096 --vocab 126464 --hidden 2048 \
    --ce-dtype bfloat16 --repeats 3
e2e() {
    local runs="$work/runs"
    for dtype in float32 bfloat16; do
        dare train --algo d1 --model llada trainer.steps=2 trainer.batch_size=8 eval.before=false \
            eval.after=false model.device="$device" model.dtype="$dtype" progress=false \
            output_dir="$runs" run_name="d1-$dtype" > "$work/e2e-$dtype.out" 2>&1 \
            || { tail -n 30 "$work/e2e-$dtype.out"; return 1; }
        grep -h "training paths" "$work/e2e-$dtype.out" | head -n 1 | cut -c1-400
        cat "$runs/d1-$dtype/training_paths.json"; echo
        tail -n 2 "$runs/d1-$dtype/metrics.jsonl" | cut -c1-400
    done
}
export -f e2e
TAIL=12 stage e2e 120 bash -c e2e
stage rollout 120 dare bench rollout "${common[@]}" --dtype bfloat16 --prompt-length 64 \
    --gen-length 256 --block-length 32 --batch "$batch" --repeats 2
stage rl 120 dare bench rl "${common[@]}" --dtype bfloat16 --prompt-length 64 --gen-length 256 \
    --block-length 32 --batch "$batch" --group-size 2 --repeats 2

cat "$out/summary.txt"
rm -rf "$work"
