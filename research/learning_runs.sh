#!/usr/bin/env bash
# Short learning runs of the RL algorithms on the bundled tiny checkpoints, one after another,
# each followed by its reward/accuracy curves (the docs/results.md tables and PNGs).
#   bash research/learning_runs.sh OUT_DIR "ALGO:FAMILY[:key=value,...]" ...
# e.g.
#   bash research/learning_runs.sh runs/results "mdpo:llada:trainer.steps=15" "bgpo:sdar"
# Needs matplotlib for the PNGs (pip install 'dare-core[plot]'); runs are sequential because
# the 2-core CPU gives no speed to parallel ones.
set -euo pipefail
out="${1:?usage: learning_runs.sh OUT_DIR ALGO:FAMILY[:k=v,...] ...}"
shift
mkdir -p "$out"
for spec in "$@"; do
    IFS=: read -r algo family extra <<<"$spec"
    name="${algo}-${family}"
    overrides=()
    if [[ -n "${extra:-}" ]]; then
        IFS=, read -r -a overrides <<<"$extra"
        name="${name}-$(printf '%s' "$extra" | tr ',=/' '_-_' | tr -cd 'A-Za-z0-9_.-')"
    fi
    echo "== $name"
    dare train --algo "$algo" --model "$family" output_dir="$out" run_name="$name" progress=false \
        "${overrides[@]}" 2>&1 | tee "$out/$name.log" | grep -E "^(eval|error)|accuracy [0-9]" || true
    if [[ -f "$out/$name/metrics.jsonl" ]]; then
        dare plot "$out/$name" -m reward -m eval.accuracy --smooth 5 -o "$out/$name.png" || true
    fi
done
