#!/usr/bin/env bash
# The vllm rollout backend on a GPU machine that can reach PyPI: vLLM (a multi-GB CUDA build) is
# installed here, never on the CPU machines, and the default test suite does not need it.
#   OUT=/some/dir bash scripts/device/vllm_check.sh
# Stages, each under its own time limit (lib.sh's `stage`), in order:
#   install      the repository's core and plugins/rollouts/dare-plugin-vllm with its [vllm] extra (vLLM >= 0.32)
#   engine_test  the opt-in real-engine test (DARE_VLLM_TEST=1, pytest -m vllm): an engine given new
#                weights through load_weights generates what a fresh engine of them generates
#   tiny         tokens/s of the vllm backend vs transformers' DiffusionGemma generate, tiny model
#   26b          the same on the 26B-A4B shape at reduced depth (LAYERS layers, default 6)
# What comes back under $OUT: summary.txt (each stage's exit code and last lines), logs.tgz (every
# stage's full log) and the throughput JSON of each measurement, rewritten as each stage ends so a
# run cut short keeps what ran. Knobs (environment): ONLY (space-separated stage names), LAYERS,
# BATCH (16), GEN_LENGTH (256).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/device/lib.sh
. scripts/device/lib.sh
layers="${LAYERS:-6}"
batch="${BATCH:-16}"
gen="${GEN_LENGTH:-256}"

TAIL=5 stage install 1500 "$py" -m pip install -q -e . -e "./plugins/rollouts/dare-plugin-vllm[vllm,test]"
TAIL=20 stage engine_test 600 env DARE_VLLM_TEST=1 "$py" -m pytest -q -p no:cacheprovider -rs -m vllm \
    plugins/rollouts/dare-plugin-vllm/tests
stage tiny 600 "$py" scripts/device/vllm_check.py --shape tiny --batch "$batch" --gen-length "$gen" \
    --out "$out/throughput_tiny.json"
stage 26b 1200 "$py" scripts/device/vllm_check.py --shape 26b-a4b --layers "$layers" --batch "$batch" \
    --gen-length "$gen" --out "$out/throughput_26b_a4b_${layers}l.json"

cat "$out/summary.txt"
rm -rf "$work"
