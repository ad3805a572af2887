"""Output through a pipe is not cut at 80 columns: help keeps its option names whole, tables
their digits (the real console command in a subprocess, stdout a pipe, no terminal)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _piped(*args, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    r = subprocess.run([sys.executable, "-m", "recycle.cli", *args], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL,
                       env={**base, "PYTHONPATH": ROOT, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.hard_timeout(90)
def test_help_and_tables_through_a_pipe_are_not_truncated():
    out = _piped("train", "--help")
    assert "…" not in out, out
    for name in ("--detect-stragglers", "--no-detect-stragglers", "--checkpoint-dir",
                 "executor.compute.model.Workload"):
        assert name in out, (name, out)
    out = _piped("plan", "examples/job.json", "--fail", "1:2")
    assert "…" not in out and "1:3" in out, out


@pytest.mark.hard_timeout(60)
def test_columns_given_is_honoured():
    out = _piped("train", "--help", COLUMNS="100")
    assert max(len(ln) for ln in out.splitlines()) <= 100
