#!/usr/bin/env bash
# The CUDA path on one GPU, in under 8 minutes: writes benchmarks/results/gpu.md.
#   scripts/gpu_check.sh [--dry-run] [--out PATH] [--only SECTIONS] [--peak-tflops X]
# --dry-run: the same on the CPU with tiny sizes (into a temp file). docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PYTHONPATH=. exec "$PY" -m benchmarks.gpu_check "$@"
