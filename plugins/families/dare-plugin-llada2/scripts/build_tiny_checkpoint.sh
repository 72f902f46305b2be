#!/usr/bin/env bash
# Rebuild the bundled tiny LLaDA2 checkpoint from scratch.
#   bash plugins/families/dare-plugin-llada2/scripts/build_tiny_checkpoint.sh [OUT_DIR]
# One thread per process: on a shared CPU two OpenMP threads are ~8x slower than one.
set -euo pipefail
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-build/tiny-sudoku}"
work="${WORK_DIR:-$(mktemp -d)}"

# 1. random LLaDA2-MoE weights (layer 0 dense, 3 MoE layers of 4 experts in 2 groups, top-2,
#    one shared expert; block size 8) + a small BPE tokenizer trained on Sudoku and Countdown texts
dare init --model llada2 --out "$work/init" --task sudoku --task countdown --seed 0 \
    hidden_size=96 num_hidden_layers=4 num_attention_heads=4 num_key_value_heads=2 head_dim=24 \
    intermediate_size=256 moe_intermediate_size=64 num_experts=4 num_experts_per_tok=2 n_group=2 \
    topk_group=1 num_shared_experts=1 first_k_dense_replace=1 block_size=8
# 2. block-diffusion SFT ([noisy | clean] layout through the wrapper) on generated Sudoku puzzles
dare train --algo sft --model llada2 --config "$here/recipes/tiny_sudoku_sft.yaml" \
    model.path="$work/init" output_dir="$work/runs" run_name=sft progress=false
# 3. the trained model in the published layout (sharded safetensors + index), its tokenizer and
#    the run presets that suit it
mkdir -p "$out"
python - "$work/runs/sft/final" "$out" <<'PY'
import sys
import dare_plugin_llada2  # registers llada2_moe with the Auto classes
from transformers import AutoModelForCausalLM, AutoTokenizer
src, dst = sys.argv[1], sys.argv[2]
AutoModelForCausalLM.from_pretrained(src).save_pretrained(dst, max_shard_size="1MB")
AutoTokenizer.from_pretrained(src).save_pretrained(dst)
PY
cp "$here/recipes/tiny_sudoku_defaults.yaml" "$out/dare_defaults.yaml"
echo "wrote $out"
