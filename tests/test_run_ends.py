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
    assert sorted(os.listdir(run)) == ["run.toml", "worker-0-0.log", "worker-0-1.log"], r.stderr
    assert (ckpt / "iter000001" / "recycle.json").exists(), os.listdir(ckpt)


BOOM = '''
from examples.mlp_workload import MLPStage, workload as mlp
from executor.compute.model import Workload


class Boom(MLPStage):
    def forward(self, x):
        if self.head is not None:  # the last stage's forward always raises
            raise ValueError("boom: a bug in the user's forward")
        return super().forward(x)


def workload():
    w = mlp()
    return Workload(build_stage=Boom, loss_fn=w.loss_fn, microbatch=w.microbatch)
'''


@pytest.mark.hard_timeout(120)
def test_an_exception_in_the_model_is_reported_as_the_models_with_exit_4(tmp_path):
    # It used to look like every last-stage worker had died: "stage 1 has no live replica,
    # restore from checkpoint", exit 3, with the cause only in the logs.
    (tmp_path / "boom_model.py").write_text(BOOM)
    run = tmp_path / "run"
    r = train("--model", "boom_model:workload", "-d", "2", "-s", "2", "-m", "2",
              "--iterations", "2", "--run-dir", str(run),
              pythonpath=os.pathsep.join([ROOT, str(tmp_path)]))
    err = " ".join(r.stderr.split())  # rich wraps long lines (a long path even mid-word)
    flat = "".join(r.stderr.split())
    assert r.returncode == 4, r.stderr
    assert "no live replica" not in err and "Traceback" not in err, r.stderr
    who = next(w for w in ("0:1", "1:1") if f"halted: worker {w}: " in err)
    assert (f"worker {who}: the model raised ValueError: boom: a bug in the user's forward "
            f"(in its forward of micro-batch ") in err, r.stderr
    log = run / f"worker-{who.replace(':', '-')}.log"
    assert "".join(f"traceback in {log}".split()) in flat, r.stderr
    halt_line = next(line for line in r.stderr.splitlines() if "training halted" in line)
    assert f"traceback in {log}" in halt_line, r.stderr  # one line: the path is whole
    assert "fix the model first" in halt_line, r.stderr  # resuming alone would raise again
    assert 'raise ValueError("boom' in log.read_text()  # the full traceback is there
