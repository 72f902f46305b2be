#!/usr/bin/env bash
# Rebuild the bundled tiny Dream checkpoint from scratch (CPU; see the README for the time).
#   bash plugins/families/dare-plugin-dream/scripts/build_tiny_checkpoint.sh [OUT_DIR] [STEP]
# STEP = which saved checkpoint of the 800-step SFT run to keep: "final" (the end of the run, the
# bundled one) or a multiple of 100.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-build/tiny-sudoku-dream}"
step="${2:-final}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. random Dream weights + a small BPE tokenizer trained on Sudoku and Countdown texts
dare init --model dream --out "$work/init" --task sudoku --task countdown --seed 0 \
    hidden_size=96 num_attention_heads=4 num_key_value_heads=2 num_hidden_layers=4 \
    intermediate_size=256 vocab_size=640
# 2. masked-diffusion SFT on generated Sudoku puzzles
dare train --algo sft --model dream --config "$here/recipes/tiny_sudoku_sft.yaml" \
    model.path="$work/init" output_dir="$work/runs" run_name=sft progress=false
# 3. the trained model + the run presets that suit it
mkdir -p "$out"
if [ "$step" = final ]; then src="$work/runs/sft/final"; else src="$work/runs/sft/checkpoints/step-$step"; fi
cp "$src"/* "$out"/
cp "$here/recipes/tiny_sudoku_defaults.yaml" "$out/dare_defaults.yaml"
chmod 644 "$out"/*
echo "wrote $out"
