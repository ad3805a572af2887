"""`recycle train --resume DIR` alone continues the checkpoint's run: grid, job spec (and
the stage split its per-layer costs gave), model flags and workload come from the
checkpoint's manifest; flags given still win where a resume may change them. The real
console command in subprocesses, real worker processes."""
import json
import os
import subprocess
import sys

import pytest

from executor.compute.one_process.reference import Summary, compare
from planner.job import JobSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args):
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *args],
                       capture_output=True, text=True, timeout=200, cwd=ROOT,
                       stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.hard_timeout(280)
def test_resume_dir_and_iterations_alone_continue_the_run_exactly(tmp_path):
    job = tmp_path / "job.json"  # per-layer costs: the default split is balanced, (1, 4)
    job.write_text(JobSpec.uniform(1, 3, 2).model_copy(
        update={"layer_cost": [1, 1, 1, 1, 1, 20]}).model_dump_json())
    run = ["-d", "1", "-s", "3", "-m", "2", "--job", str(job), "--vocab", "32",
           "--seq-len", "8", "--d-model", "16", "--heads", "4", "--layers", "4",
           "--micro-batch-size", "2", "--seed", "3", "--lr", "5e-3"]
    ck, ref, out = tmp_path / "ck", tmp_path / "ref.json", tmp_path / "out.json"
    _cli(*run, "--iterations", "2", "--checkpoint-dir", str(ck), "--timeout", "4",
         "--run-dir", str(tmp_path))
    man = json.loads((ck / "iter000001" / "recycle.json").read_text())
    assert man["model"]["boundaries"] == [1, 4] and man["job"]["layer_cost"], man
    err = _cli("--resume", str(ck), "--iterations", "4", "--summary", str(out),
               "--run-dir", str(tmp_path))
    assert "resuming" not in err, err  # nothing differs from the checkpoint's run
    _cli(*run, "--iterations", "4", "--reference", "--summary", str(ref))
    got, want = Summary.load(str(out)), Summary.load(str(ref))
    assert len(got.losses) == 4 and not compare(got, want, 1e-5), (got, want)
