#!/usr/bin/env bash
# Rebuild the bundled tiny DiffusionGemma checkpoint from scratch (5-13 min on 2 shared CPU cores;
# one thread per process is the fastest on a shared machine).
#   bash plugins/families/dare-plugin-diffusiongemma/scripts/build_tiny_checkpoint.sh [OUT_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-build/tiny-sudoku}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# 1. random DiffusionGemma weights (4 layers, canvases of 8, 16 denoising steps at most per canvas)
#    + a small Gemma-4-style BPE tokenizer
dare init --model diffusiongemma --out "$work/init" --task sudoku --task countdown --seed 0 \
    num_hidden_layers=4 canvas_length=8 max_denoising_steps=16
# 2. uniform-noise SFT (flat cross entropy over the canvases) on generated Sudoku puzzles
dare train --algo sft --model diffusiongemma --config "$here/recipes/tiny_sudoku_sft.yaml" \
    model.path="$work/init" output_dir="$work/runs" run_name=sft progress=false
# 3. the trained model + the run presets that suit it
mkdir -p "$out"
cp "$work"/runs/sft/final/* "$out"/
cp "$here/recipes/tiny_sudoku_defaults.yaml" "$out/dare_defaults.yaml"
echo "wrote $out"
