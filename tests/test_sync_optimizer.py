"""`recycle train --sync` runs a synchronous optimizer for real: a barrier after every
iteration, so no worker starts iteration i+1 before every worker has stepped iteration i
(the flag used to change only the plan, and the workers ran it staggered)."""
import glob
import io
import re

import pytest
from rich.console import Console

from executor.launch.launcher import train
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import compare, train_reference
from planner.job import JobSpec
from planner.plan import Mode

pytestmark = pytest.mark.hard_timeout(120)
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)


def _times(tmp_path, what):
    out: dict[int, list[float]] = {}
    for f in glob.glob(str(tmp_path / "worker-*.log")):
        for it, t in re.findall(rf"iteration (\d+) {what} at ([\d.]+)", open(f).read()):
            out.setdefault(int(it), []).append(float(t))
    return out


def test_sync_flag_puts_a_barrier_between_iterations(tmp_path):
    D, S, M, iterations = 2, 2, 2, 3
    spec = LaunchSpec(CFG, JobSpec.uniform(D, S, M), iterations, deadline_s=50,
                      summary_path=str(tmp_path / "s.json"), run_dir=str(tmp_path),
                      mode=Mode(staggered=False), **sections(timeout=4.0))
    res = train(spec, console=Console(file=io.StringIO()))
    assert res.summary is not None, res.halted
    assert not compare(res.summary, train_reference(CFG, D, M, iterations, S), 1e-5)
    entered, stepped = _times(tmp_path, "entered"), _times(tmp_path, "stepped")
    assert sorted(entered) == sorted(stepped) == list(range(iterations))
    for it in range(1, iterations):
        assert len(entered[it]) == len(stepped[it - 1]) == D * S
        # the last worker to step iteration it-1 did so before the first one entered it
        assert min(entered[it]) >= max(stepped[it - 1]), (it, entered, stepped)
