#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, tune a matmul and a convolution on the GPU with
# autotune's engine and with stock MetaSchedule side by side, check the engine's parallel
# timings against isolated ones, and write results/bench/gpu.json. Also runs the GPU tests.
#   bench/gpu_check.sh [--trials 64] [--candidates 48]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! nvidia-smi -L; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi failed); run this on a machine with one" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q -e '.[test]'
fi
.venv/bin/python -m pytest -q tests/test_devices.py
.venv/bin/python -m bench.gpu "$@"
