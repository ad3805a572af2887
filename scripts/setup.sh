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
# Debian packages the tests use: a real headless browser for the live page
# (tests/test_page_browser.py), a real PostgreSQL server (tests/test_store_postgres.py),
# and `ip`, `tc` and `nft` for test hosts in network namespaces whose links fail
# (tests/test_network_faults.py). Skipped in a second when already there.
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || [ -x /usr/lib/chromium/chromedriver ] || need+=(chromium-driver)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
{ have ip && have tc; } || need+=(iproute2)
have nft || need+=(nftables)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    "${need[@]}" >/dev/null
fi
.venv/bin/pip install -q -e ".[dev,postgres,hf,tokens,peers]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import planner, torch, ortools, fastapi, selenium, psycopg, transformers, tokenizers, torchft; print('setup ok: torch', torch.__version__)"
