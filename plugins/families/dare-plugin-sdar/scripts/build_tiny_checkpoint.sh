#!/usr/bin/env bash
# Rebuild the bundled tiny SDAR checkpoints from scratch (the dense one takes about an hour on
# 2 busy CPU cores; the MoE one is random and takes seconds).
#   bash plugins/families/dare-plugin-sdar/scripts/build_tiny_checkpoint.sh [OUT_DIR] [MOE_OUT_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-build/tiny-sudoku}"
moe_out="${2:-build/tiny-moe-random}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. random SDAR (dense, published sdar layout) weights + a small Qwen3-style BPE tokenizer
dare init --model sdar --out "$work/init" --task sudoku --task countdown --seed 0 \
    hidden_size=64 num_attention_heads=4 num_key_value_heads=2 head_dim=16 \
    num_hidden_layers=4 intermediate_size=192
# 2. block-diffusion SFT ([noisy | clean] BD3LM objective) on generated Sudoku puzzles
dare train --algo sft --model sdar --config "$here/recipes/tiny_sudoku_sft.yaml" \
    model.path="$work/init" output_dir="$work/runs" run_name=sft progress=false
# 3. the trained model + the run presets that suit it
mkdir -p "$out"
cp "$work"/runs/sft/final/* "$out"/
cp "$here/recipes/tiny_sudoku_defaults.yaml" "$out/dare_defaults.yaml"
echo "wrote $out"
# 4. an untrained SDAR-MoE (sdar_moe) checkpoint of the same tokenizer, for loading/generation
dare init --model sdar --out "$moe_out" --task sudoku --task countdown --seed 0 model_type=sdar_moe \
    hidden_size=64 num_attention_heads=4 num_key_value_heads=2 head_dim=16 num_hidden_layers=2 \
    intermediate_size=192 num_experts=4 num_experts_per_tok=2 moe_intermediate_size=64
echo "wrote $moe_out"
