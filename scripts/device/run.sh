#!/usr/bin/env bash
# One prepared GPU session: install DARE offline, a `dare bench` run on a ~1B-parameter random
# LLaDA-shape model in bf16 (issue 6), then longer RL learning runs on the bundled tiny
# checkpoints, several at once on the one GPU (the runs that are too slow for the CPU machine).
# Meant for the `device` tool, after `bash scripts/device/prepare.sh` here:
#   run(command="bash scripts/device/run.sh", carry=[".device"], timeout_s=570)
# Everything comes back under $OUT as at most 8 files: bench.json, learning.txt (the before/after
# table), runs.tar.gz (metrics.jsonl, summary.json, config.yaml and logs of every run), setup.log.
# Knobs (environment): BENCH_S (bench time limit, default 150), RUNS_S (learning runs' limit,
# default 330), STEPS (RL steps per run, default 300), DARE_DEVICE (cuda; cpu for a dry run here),
# EXTRA (more key=value overrides for every run, e.g. "task.num_eval=8" for a dry run), ONLY
# (space-separated run names: run only these).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-runs/device-out}"
mkdir -p "$out"
work="$(mktemp -d)"
device="${DARE_DEVICE:-cuda}"
steps="${STEPS:-300}"
py="$(command -v python3 || command -v python)"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

{
    echo "== setup $(date -u +%FT%TZ)"
    if [ -d .device/wheels ]; then
        "$py" -m pip install -q --no-index --find-links .device/wheels cattrs
    fi
    plugins=()
    for p in plugins/*/; do [ -f "$p/pyproject.toml" ] && plugins+=(-e "$p"); done
    "$py" -m pip install -q --no-deps --no-build-isolation -e . "${plugins[@]}"
    "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__)"
    dare plugins | head -n 3
} > "$out/setup.log" 2>&1
command -v dare >/dev/null || { echo "dare did not install; see setup.log"; cat "$out/setup.log"; exit 1; }

# 1. rollout benchmark, issue 6's GPU check: ~1B random LLaDA-shape model, bf16
if [ "$device" = cuda ]; then
    timeout "${BENCH_S:-150}" dare bench rollout --model llada --random --device cuda --dtype bfloat16 \
        --size d_model=2048 --size n_heads=16 --size n_kv_heads=16 --size n_layers=20 \
        --size mlp_hidden_size=5632 --prompt-length 64 --gen-length 256 --block-length 32 --batch 8 \
        --repeats 2 > "$work/bench.log" 2>&1
    tail -n 1 "$work/bench.log" > "$out/bench.json"
fi

# 2. learning runs, all at once (tiny models: the GPU is far from full)
common=(output_dir="$work/runs" progress=false eval.every=50 trainer.steps="$steps" model.device="$device")
b32=(trainer.batch_size=32 trainer.lr=3e-5)
fastllada=(rollout.backend=fast rollout.cache=delayed rollout.decoding=quota)
declare -A runs=(
    [d1-llada]="--algo d1 --model llada"
    [d1-dream]="--algo d1 --model dream"
    [spg-llada]="--algo spg --model llada ${b32[*]} ${fastllada[*]}"
    [coupled_grpo-llada]="--algo coupled_grpo --model llada ${b32[*]} ${fastllada[*]}"
    [bgpo-llada]="--algo bgpo --model llada ${b32[*]} ${fastllada[*]} algorithm.mc_num=4 algorithm.n_l=4"
    [espo-llada]="--algo espo --model llada ${b32[*]} ${fastllada[*]}"
    [ebpo-sdar]="--algo ebpo --model sdar ${b32[*]} algorithm.mc_num=4 algorithm.n_l=4"
    [coupled_grpo-sdar]="--algo coupled_grpo --model sdar ${b32[*]}"
)
mkdir -p "$work/runs"
for name in ${ONLY:-${!runs[@]}}; do
    [ -n "${runs[$name]:-}" ] || { echo "unknown run $name (valid: ${!runs[*]})"; continue; }
    # shellcheck disable=SC2086
    timeout "${RUNS_S:-330}" dare train ${runs[$name]} "${common[@]}" run_name="$name" \
        ${EXTRA:-} > "$work/runs/$name.log" 2>&1 &
done
wait

# 3. the table: before, every evaluation, paired comparison of the last one
"$py" - "$work/runs" > "$out/learning.txt" <<'PY'
import json, os, sys
root = sys.argv[1]
print(f"{'run':22} {'steps':>5}  accuracy: before -> evaluations ...  (last vs before)")
for name in sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))):
    path = os.path.join(root, name, "metrics.jsonl")
    if not os.path.exists(path):
        print(f"{name:22} no metrics (see {name}.log)")
        continue
    lines = [json.loads(l) for l in open(path)]
    evals = [(l["step"], l["eval"]) for l in lines if "eval" in l]
    steps = max((l["step"] for l in lines if "reward" in l), default=0)
    accs = " -> ".join(f"{100 * e['accuracy']:.1f}@{s}" for s, e in evals)
    pair = evals[-1][1].get("vs_before") if evals else None
    tail = (f"  (+{pair['gained']}/-{pair['lost']}, p={pair['p_value']:.3g})" if pair else "")
    print(f"{name:22} {steps:>5}  {accs}{tail}")
PY
cat "$out/learning.txt"
tar -czf "$out/runs.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='*.pt' runs $(ls "$work"/*.log 2>/dev/null | xargs -r -n1 basename)
rm -rf "$work"
