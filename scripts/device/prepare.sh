#!/usr/bin/env bash
# Prepare, on this (CPU) machine, what scripts/device/run.sh and scripts/device/engines.sh need
# on a GPU machine that can reach nothing: the wheels of the dependencies its image lacks (cattrs;
# deepspeed, built here as a pure-Python wheel whose CUDA ops compile on first use, and the
# packages it needs; the image runs Python 3.12), into
# .device/wheels (git-ignored; pass `carry: [".device"]` to the device tool).
#   bash scripts/device/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/wheels
python -m pip download -q --only-binary=:all: --python-version 3.12 -d .device/wheels "cattrs>=23.2" \
    hjson msgpack ninja einops py-cpuinfo
DS_BUILD_OPS=0 python -m pip wheel -q --no-deps -w .device/wheels deepspeed
ls .device/wheels
