#!/usr/bin/env bash
# Rebuild the bundled tiny LLaDA checkpoint from scratch (about 10 minutes on 2 CPU cores).
#   bash plugins/families/dare-plugin-llada/scripts/build_tiny_checkpoint.sh [OUT_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-build/tiny-sudoku}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. random LLaDA weights + a small BPE tokenizer trained on Sudoku and Countdown texts
dare init --model llada --out "$work/init" --task sudoku --task countdown --seed 0 \
    d_model=96 n_heads=4 n_kv_heads=4 n_layers=4 mlp_hidden_size=256
# 2. masked-diffusion SFT on generated Sudoku puzzles
dare train --algo sft --model llada --config "$here/recipes/tiny_sudoku_sft.yaml" \
    model.path="$work/init" output_dir="$work/runs" run_name=sft progress=false
# 3. the trained model + the run presets that suit it
mkdir -p "$out"
cp "$work"/runs/sft/final/* "$out"/
cp "$here/recipes/tiny_sudoku_defaults.yaml" "$out/dare_defaults.yaml"
echo "wrote $out"
