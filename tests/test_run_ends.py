"""Runs that do not end cleanly, as a new user meets them through `recycle train`: real
CLI processes, real workers. Each failure must say what it is, not "no live replica"."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--vocab", "8", "--seq-len", "4", "--d-model", "16", "--layers", "2",
         "--micro-batch-size", "2"]


def train(*args, cwd=ROOT, pythonpath=ROOT, timeout=100):
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "recycle.cli", "train", *SMALL, *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.hard_timeout(120)
def test_run_dir_is_created_when_checkpoints_go_elsewhere(tmp_path):
    # Nothing created RUN_DIR but the default checkpoint dir inside it: every worker died
    # opening its log, reported as "stage 1 has no live replica".
    run, ckpt = tmp_path / "new" / "run", tmp_path / "ckpt"
    r = train("-d", "1", "-s", "2", "-m", "2", "--iterations", "2",
              "--run-dir", str(run), "--checkpoint-dir", str(ckpt))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(run)) == ["worker-0-0.log", "worker-0-1.log"], r.stderr
    assert (ckpt / "iter000001" / "recycle.json").exists(), os.listdir(ckpt)
