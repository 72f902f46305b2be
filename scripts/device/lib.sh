# Shared by the prepared GPU runs (scripts/device/run.sh, scripts/device/engines.sh): the output
# folder, `stage NAME LIMIT_S CMD...` (run unless ONLY excludes it; log, summarise, pack) and
# `setup` (install the repository into the machine's python). Sourced from the repository root.
out="${OUT:-runs/device-out}"
mkdir -p "$out"
work="$(mktemp -d)"
device="${DARE_DEVICE:-cuda}"
py="$(command -v python3 || command -v python)"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false py device work
: > "$out/summary.txt"

stage() {  # stage NAME LIMIT_S CMD...: run unless ONLY excludes it; log, summarise, pack
    local name="$1" limit="$2"
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
    local t0=$SECONDS
    timeout "$limit" "$@" > "$work/$name.log" 2>&1
    local rc=$?
    {
        echo "== $name: rc=$rc, $((SECONDS - t0)) s (limit $limit)"
        grep -v '^{' "$work/$name.log" | grep -v -e 'it/s\]' -e '^\[[0-9]*/[0-9]*\]' | tail -n "${TAIL:-25}"
        grep '^{' "$work/$name.log" | tail -n 1 | cut -c1-3000
    } >> "$out/summary.txt"
    tar -czf "$out/logs.tgz" -C "$work" $(cd "$work" && ls *.log)
}

setup() {
    if [ -d .device/wheels ]; then
        "$py" -m pip install -q --no-index --find-links .device/wheels cattrs || return 1
        "$py" -m pip install -q --no-index --find-links .device/wheels deepspeed hjson msgpack ninja \
            einops py-cpuinfo || echo "deepspeed not installed: its stages will fail"
    fi
    "$py" -m pip install -q --no-deps --no-build-isolation -e . || return 1
    # the plugins in four concurrent pip processes (separate packages; about 4x faster than one)
    local i=0 pids=() groups=("" "" "" "")
    for p in plugins/*/*/; do
        [ -f "$p/pyproject.toml" ] && groups[$((i % 4))]+=" -e $p" && i=$((i + 1))
    done
    for g in "${groups[@]}"; do
        # shellcheck disable=SC2086
        [ -n "$g" ] && { "$py" -m pip install -q --no-deps --no-build-isolation $g & pids+=($!); }
    done
    for pid in "${pids[@]}"; do wait "$pid" || return 1; done
    "$py" -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__, 'triton', triton.__version__)"
    "$py" -c "from dare_core.ops.attention import available_kernels as a; import torch; print('kernels fp32', a('$device', torch.float32), 'bf16', a('$device', torch.bfloat16))"
    dare plugins | head -n 3
}
export -f setup
