#!/usr/bin/env bash
# Set up .venv with everything the project needs. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# A bare torch requirement would pull the CUDA build (several GB); take the local CPU
# build first when torch is not importable, so the range in pyproject is already met.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
.venv/bin/pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import planner, torch, ortools, fastapi; print('setup ok: torch', torch.__version__)"
