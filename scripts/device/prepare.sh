#!/usr/bin/env bash
# Prepare, on this (CPU) machine, what scripts/device/run.sh needs on a GPU machine that can
# reach nothing: the pure-Python wheels of the dependencies its image lacks (cattrs and what it
# needs; the image runs Python 3.12), into
# .device/wheels (git-ignored; pass `carry: [".device"]` to the device tool).
#   bash scripts/device/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/wheels
python -m pip download -q --only-binary=:all: --python-version 3.12 -d .device/wheels "cattrs>=23.2"
ls .device/wheels
