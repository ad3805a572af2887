"""At default flags a run survives what a copy of every stage survives (docs/executor.md,
"Peer-memory snapshots": on by default, K chosen from their cost). The two runs a user met
halting before snapshots were on by default, as the user typed them: real CLI processes,
real SIGKILLs, compared with `recycle train --reference`."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.hard_timeout(180)

TOL = 1e-5


def _train(tmp_path, name, *args):
    summary = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *args,
                        "--summary", str(summary), "--run-dir", str(tmp_path / name)],
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(summary.read_text()), r.stderr


def _exact(tmp_path, grid, faults):
    got, out = _train(tmp_path, "run", *grid, *faults)
    ref, _ = _train(tmp_path, "ref", *grid, "--reference")
    assert len(got["losses"]) == len(ref["losses"])
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert worst <= TOL, (worst, out)
    return got, out


def test_2x2_losing_stage_1_whole_at_default_flags_finishes_exact(tmp_path):
    got, out = _exact(tmp_path, ["-d", "2", "-s", "2", "-m", "4", "--iterations", "8"],
                      ["--kill", "0:1@2", "--kill", "1:1@3"])
    el = got["elastic"]
    assert el["snapshot_restores"] == 1 and isinstance(el["snapshot_every"], int), el
    assert "peer-memory snapshots every" in out and "snapshots every" in out


def test_2x3_kill_and_rejoin_schedule_at_default_flags_finishes_exact(tmp_path):
    # drawn as `recycle chaos` draws: a returning worker was moved away from a stage left
    # with one copy, whose last holder then died (it halted without snapshots)
    _exact(tmp_path, ["-d", "2", "-s", "3", "-m", "4", "--iterations", "12"],
           ["--kill", "1:2@1", "--kill", "1:1@2", "--kill", "1:0@3", "--kill", "0:2@4",
            "--kill", "0:0@7", "--kill", "1:2@8", "--rejoin", "1:2@4", "--rejoin", "1:0@6",
            "--rejoin", "0:2@6", "--rejoin", "1:2@9"])


THREE_OF_FOUR = ["--kill", "0:0@2", "--kill", "0:1@2", "--kill", "1:1@2",
                 "--rejoin", "0:1@4", "--rejoin", "1:1@5"]


def test_a_rejoin_due_while_paused_starts_and_the_run_resumes_exact(tmp_path):
    # --shape fixed: three of four workers die in iteration 2: one live worker cannot serve
    # two stages, the run pauses; the rejoin due at iteration 4 cannot wait for the run to
    # get there (nothing trains while paused): it starts now (before, it halted after 25 s)
    got, out = _exact(tmp_path, ["-d", "2", "-s", "2", "-m", "4", "--iterations", "8",
                                 "--shape", "fixed"], THREE_OF_FOUR)
    assert got["elastic"]["pauses"] == 1 and "training resumes after" in out, out


def test_three_of_four_lost_at_default_flags_the_last_trains_alone_and_never_pauses(tmp_path):
    # the same losses at default flags (--shape auto): the live worker trains the whole
    # model as one stage, and the returning workers join the shape the planner chooses
    got, out = _exact(tmp_path, ["-d", "2", "-s", "2", "-m", "4", "--iterations", "8"],
                      THREE_OF_FOUR)
    assert got["elastic"]["pauses"] == 0, out
    assert "the pipeline changes shape to 1 stages" in out, out
