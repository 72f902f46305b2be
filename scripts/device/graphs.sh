#!/usr/bin/env bash
# The prepared GPU check of the static-shape cached decode steps (`graphs`, docs/benchmarks.md
# "GPU: one H200"), for the `device` tool, after `bash scripts/device/prepare.sh` here:
#   run(command="bash scripts/device/graphs.sh", carry=[".device"], timeout_s=580)
# Stages, each under its own time limit, in order of value:
#   pytest      the captured steps against eager on CUDA (fast: LLaDA, Dream; block: SDAR; LLaDA2's
#               host-synchronising MoE refused / run uncaptured), then the CUDA checks of run.sh
#               (document kernels, fused CE, the family contracts' packed-kernel tests)
#   init        the ~1B-parameter random LLaDA-shape checkpoint (d 2048, 20 layers, MLP 5632)
#   rollout     `dare bench rollout`, bf16, batch 8, gen 256, block 32, one token per step: the
#               no-cache reference vs the dual cache eager (side `cached`) vs the dual cache with
#               CUDA graphs (side `accelerated`, graphs=auto)
#   rl_masked   `dare bench rl --preset paper-masked` on that model (group 8, block 32, responses 256
#               and 512): eager vs cached vs cached + CUDA graphs, ratios side by side
#   rl_block    `dare bench rl --preset paper-block` on a random SDAR-architecture model of the same
#               width and depth (block 32): no cache vs block KV cache vs block KV cache + CUDA graphs
# Results: $OUT/summary.txt (every stage's exit code, last lines and JSON line) and logs.tgz (full
# logs), rewritten after every stage, so a cut-short call keeps what ran. Knobs (environment):
# DARE_DEVICE (cuda; cpu for a dry run here), ONLY (space-separated stage names), SIZES / BLOCK_SIZES
# (architectures, "k=v k=v"), BATCH (8), GEN (a response length replacing the presets' 256 and
# 512, for dry runs), PYTEST_K (the kernel tests' -k expression).
set -uo pipefail
cd "$(dirname "$0")/../.."
sizes="${SIZES:-d_model=2048 n_heads=16 n_kv_heads=16 n_layers=20 mlp_hidden_size=5632}"
block_sizes="${BLOCK_SIZES:-hidden_size=2048 num_hidden_layers=20 num_attention_heads=16 num_key_value_heads=16 head_dim=128 intermediate_size=5632}"
batch="${BATCH:-8}"
gen=()
[ -n "${GEN:-}" ] && gen=(--gen-length "$GEN")
# shellcheck source=scripts/device/lib.sh
. scripts/device/lib.sh
TAIL=6 stage setup 150 bash -c setup
command -v dare >/dev/null || { cat "$out/summary.txt"; exit 1; }

stage pytest 180 "$py" -m pytest -q -p no:cacheprovider -rs plugins/rollouts/dare-plugin-samplers/tests/test_static_steps.py \
    tests/test_cuda_kernels.py plugins/families/dare-plugin-llada/tests/test_contract.py \
    plugins/families/dare-plugin-dream/tests/test_contract.py \
    -k "${PYTEST_K:-cuda or packed_kernels or fused_cross_entropy or every_kernel or half_precision}"

ckpt="$work/llada-random"
# shellcheck disable=SC2086
TAIL=3 stage init 120 dare init --model llada --out "$ckpt" $sizes
common=(--model llada --checkpoint "$ckpt" --device "$device" --dtype bfloat16 --prompt-length 64)
stage rollout 120 dare bench rollout "${common[@]}" --gen-length "${GEN:-256}" --block-length 32 --batch "$batch" \
    --warmup 1 --repeats 2
stage rl_masked 200 dare bench rl "${common[@]}" --preset paper-masked --batch "$batch" "${gen[@]}" \
    --warmup 1 --repeats 1
block_args=()
for kv in $block_sizes; do block_args+=(--size "$kv"); done
stage rl_block 200 dare bench rl --model sdar --random "${block_args[@]}" --device "$device" --dtype bfloat16 \
    --prompt-length 64 --preset paper-block --batch "$batch" "${gen[@]}" --warmup 1 --repeats 1

cat "$out/summary.txt"
rm -rf "$work"
