"""Nothing is lost across shapes (issue 42): checkpoints go on after a change of shape, a
roll-back takes the newest copy any tier holds (disk before the seed), and `--resume`
continues a checkpoint written under any shape on any grid that keeps the global batch.
Real CLI processes, real SIGKILLs, compared with `recycle train --reference`."""
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.hard_timeout(420)

# 2x2, stage 1 lost whole (0:1, then 1:1) with 1:0: one worker left, cut to one stage
CUT = ["--kill", "0:1@2", "--kill", "1:1@3", "--kill", "1:0@3"]


def _run(tmp_path, name, *args):
    summary = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *args,
                        "--summary", str(summary), "--run-dir", str(tmp_path / name)],
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _same(tmp_path, a, b):
    c = subprocess.run([sys.executable, "-m", "recycle.cli", "compare", str(tmp_path / f"{a}.json"),
                        str(tmp_path / f"{b}.json"), "--tol", "1e-5"],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stdout


def _manifest(run_dir) -> dict:
    root = run_dir / "checkpoints"
    newest = max(n for n in os.listdir(root) if (root / n / "recycle.json").exists())
    return json.loads((root / newest / "recycle.json").read_text())


def test_checkpoints_go_on_after_a_cut_and_the_roll_back_takes_the_disk_not_the_seed(tmp_path):
    """The issue's run: before, checkpoint parts stopped at the cut (iterations 1 and 2 of
    10 on disk) and the job rolled back to iteration -1, "the new shape starts from the
    seed", with iteration 2 on disk."""
    grid = ["-d", "2", "-s", "2", "-m", "4", "--iterations", "10"]
    r = _run(tmp_path, "run", *grid, *CUT)
    man = _manifest(tmp_path / "run")
    assert man["iteration"] == 9 and man["parts"][0].startswith("shape1-"), man["parts"]
    out = " ".join((r.stdout + r.stderr).split())  # the console wraps long lines
    m = re.search(r"rolled back to iteration (-?\d+) from (.*?),", out)
    assert m and int(m.group(1)) >= 0 and m.group(2).startswith("the checkpoint on disk"), out
    assert "the seed" not in out, out
    _run(tmp_path, "ref", *grid, "--reference")
    _same(tmp_path, "run", "ref")


def test_a_cut_checkpoint_resumes_on_the_same_grid_and_on_another(tmp_path):
    """Written under a cut (one stage), resumed as 2x2 (its own grid) and as 1x4 (M
    follows: 8), each equal to an uninterrupted reference of that grid."""
    _run(tmp_path, "cut", "-d", "2", "-s", "2", "-m", "4", "--iterations", "6", *CUT)
    assert _manifest(tmp_path / "cut")["parts"][0].startswith("shape1-")
    ck = str(tmp_path / "cut" / "checkpoints")
    for name, grid in (("same", ["-d", "2", "-s", "2"]), ("other", ["-d", "1", "-s", "4"])):
        r = _run(tmp_path, name, *grid, "--iterations", "9", "--resume", ck)
        ref = grid + ["-m", "4" if name == "same" else "8"]
        _run(tmp_path, name + "-ref", *ref, "--iterations", "9", "--reference")
        _same(tmp_path, name, name + "-ref")
        assert "iter    6" in r.stdout + r.stderr and "iter    5" not in r.stdout + r.stderr


def test_a_2x4_checkpoint_resumes_as_3x2(tmp_path):
    """2x4 with M=6 (a global batch of 12), stage 3 lost whole mid-run; resumed on 3x2,
    whose M is 4."""
    _run(tmp_path, "a", "-d", "2", "-s", "4", "-m", "6", "--iterations", "4",
         "--kill", "0:3@1", "--kill", "1:3@2")
    _run(tmp_path, "b", "-d", "3", "-s", "2", "--iterations", "7", "--resume",
         str(tmp_path / "a" / "checkpoints"))
    _run(tmp_path, "ref", "-d", "3", "-s", "2", "-m", "4", "--iterations", "7", "--reference")
    _same(tmp_path, "b", "ref")
