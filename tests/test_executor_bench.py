"""`python -m benchmarks.bench_executor`'s instrumented workers (benchmarks/timed_worker.py) run under
the real launcher and report the timers the runtime-tax table is made of."""
import os
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks/ is not a package on the installed path

from benchmarks.executor_bench import TimedCoordinator, bench_config, breakdown  # noqa: E402
from benchmarks.timed_worker import TIMERS  # noqa: E402
from executor.inputs.launch_spec import LaunchSpec, sections  # noqa: E402
from planner.job import JobSpec  # noqa: E402
from benchmarks.bench_executor import app as bench_app  # noqa: E402


@pytest.mark.hard_timeout(90)
def test_timed_workers_run_and_report_the_breakdown(tmp_path):
    """The launcher's process target gained an argument (the service token) and the
    instrumented target did not follow: every benchmark worker died at start."""
    cfg = bench_config("gpt", 16, 2, 8, 2)
    spec = LaunchSpec(cfg, JobSpec.uniform(1, 2, 2), 4, solver="greedy", deadline_s=60,
                      run_dir=str(tmp_path),
                      **sections(timeout=10.0, checkpoint_every=10 ** 9))
    coord = TimedCoordinator(spec, console=Console(file=open(os.devnull, "w")))
    res = coord.run()
    assert res.summary is not None, res.halted
    assert sorted(coord.walls) == [(0, 0), (0, 1)]
    for w, walls in coord.walls.items():
        assert sorted(walls) == [0, 1, 2, 3]
        parts = breakdown(walls, 4, 1)
        assert set(parts["timers"]) == set(TIMERS)
        assert parts["compute"] > 0 and parts["snapshot"] >= 0
        assert coord.gauges[w]["snapshot_bytes"] > 0


def test_bench_bad_model_is_one_line_exit_2():
    r = CliRunner().invoke(bench_app, ["--model", "no_such_mod_7:workload"])
    err = (r.stderr if getattr(r, "stderr", None) else r.output).strip().splitlines()
    assert r.exit_code == 2 and len(err) == 1 and "cannot import no_such_mod_7" in err[0], r.output
