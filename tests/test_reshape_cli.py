"""The pipeline's shape follows the live workers (issue 33), as a user runs it: real CLI
processes, real SIGKILLs, compared with `recycle train --reference`."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.hard_timeout(180)

GRID = ["-d", "2", "-s", "4", "-m", "4", "--layers", "4", "--iterations", "12"]
KILLS = ["--snapshot-every", "2", "--kill", "0:0@2", "--kill", "0:1@3", "--kill", "1:2@4",
         "--kill", "0:3@5", "--kill", "1:3@6"]


def _train(tmp_path, name, *args):
    summary = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *args,
                        "--summary", str(summary), "--run-dir", str(tmp_path / name)],
                       capture_output=True, text=True, timeout=150)
    return r, (json.loads(summary.read_text()) if r.returncode == 0 else None)


def _exact(tmp_path, grid, faults):
    """The run with `faults`, which must end as `recycle train --reference` does (1e-5)."""
    r, got = _train(tmp_path, "run", *grid, *faults)
    assert r.returncode == 0, r.stdout + r.stderr
    _train(tmp_path, "ref", *grid, "--reference")
    c = subprocess.run([sys.executable, "-m", "recycle.cli", "compare",
                        str(tmp_path / "run.json"), str(tmp_path / "ref.json"), "--tol", "1e-5"],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stdout + r.stderr
    return r, got


def test_five_of_eight_lost_the_three_left_train_on_fewer_stages_never_paused_exact(tmp_path):
    """The issue's run: 2x4, five workers SIGKILLed for good, stage 3 with both of its;
    before, the three left paused for restarts that never came (and halted)."""
    r, got = _exact(tmp_path, GRID, KILLS)
    assert got["elastic"]["pauses"] == 0, r.stderr
    last = got["plans"][-1]
    assert last["partition"]["grid"][1] < 4 and len(last["roles"]) == 3, last
    assert "the pipeline changes shape to" in r.stderr, r.stderr


def test_shape_fixed_keeps_the_old_behaviour_and_a_bad_value_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", "--shape", "bogus"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--shape must be auto, speed or fixed" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r, _ = _train(tmp_path, "fixed", "-d", "1", "-s", "2", "--iterations", "3", "--shape",
                  "fixed", "--kill", "0:1@1")
    assert r.returncode != 0 and "cannot serve 2 stages" in r.stdout + r.stderr, r.stderr


def test_shape_speed_cuts_with_as_many_live_as_stages_goes_on_after_the_return_exact(tmp_path):
    """`--shape speed` (issue 44): the shape chosen at every event. One of 2x2 SIGKILLed
    and restarted: with three live the 2x2 grid stays (the batch of four splits no better
    over three replicas of one stage), and once the fourth is back, four replicas of the
    whole model train faster than the user's two stages (no bubbles): the run cuts the
    pipeline with every worker live, which `auto` never does, and ends equal to the
    reference."""
    grid = ["-d", "2", "-s", "2", "-m", "2", "--iterations", "10"]
    r, got = _exact(tmp_path, grid, ["--shape", "speed", "--kill", "1:1@3", "--rejoin", "1:1@6"])
    assert "the pipeline changes shape to" in r.stderr, r.stderr
    assert got["elastic"]["shape_changes"] >= 1 and got["elastic"]["pauses"] == 0, got["elastic"]
    last = got["plans"][-1]
    assert len(last["roles"]) == 4, last  # the returned worker trains again
