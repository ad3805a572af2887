"""`recycle compare A.json B.json`: summaries side by side, exit 0 within --tol, 1 beyond,
2 (one line) on a file that is missing, unreadable or not a summary."""
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from recycle.cli import app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _summary(path, losses, checksums, **extra):
    path.write_text(json.dumps({"losses": losses, "param_checksums": checksums, **extra}))
    return str(path)


def _run(*args):
    r = CliRunner().invoke(app, ["compare", *args])
    return r.exit_code, r.stdout, (r.stderr if r.stderr else r.output)


@pytest.mark.hard_timeout(60)
def test_compare_through_the_console_command(tmp_path):
    a = _summary(tmp_path / "a.json", [2.5, 2.25], [10.0, -3.0], plans=[])
    b = _summary(tmp_path / "b.json", [2.5, 2.25 + 2e-6], [10.0, -3.0])
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "compare", a, b],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert "loss[1]" in r.stdout and "checksum[stage 1]" in r.stdout and "2.250002" in r.stdout
    assert "max difference 2e-06" in r.stdout and "agree" in r.stdout, r.stdout


def test_beyond_tol_exits_1_and_says_where(tmp_path):
    a = _summary(tmp_path / "a.json", [2.5, 2.25], [10.0, -3.0])
    b = _summary(tmp_path / "b.json", [2.5, 2.25], [10.0, -3.001])
    code, out, _ = _run(a, b)
    assert code == 1 and "checksum[stage 1]" in out.splitlines()[-1], out
    assert "max difference 0.001" in out
    assert _run(a, b, "--tol", "1e-3")[0] == 0  # a looser tolerance agrees
    c = _summary(tmp_path / "c.json", [2.5], [10.0, -3.0])  # fewer iterations: no match
    code, out, _ = _run(a, c)
    assert code == 1 and "2 vs 1 iterations" in out, out


@pytest.mark.parametrize("name,content,says", [
    ("missing.json", None, "no such file"),
    ("garbage.json", os.urandom(64), "is not a run summary: not JSON"),
    ("plan.json", b'{"replicas": 2}', "is not a run summary"),
    ("strings.json", b'{"losses": ["x"], "param_checksums": [1]}', "is not a run summary"),
    ("dir", "dir", "cannot read"),
])
def test_bad_file_is_one_line_exit_2(tmp_path, name, content, says):
    good = _summary(tmp_path / "good.json", [1.0], [1.0])
    bad = tmp_path / name
    if content == "dir":
        bad.mkdir()
    elif content is not None:
        bad.write_bytes(content)
    for args in ((good, str(bad)), (str(bad), good)):
        code, _, err = _run(*args)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and says in lines[0], err
    code, _, err = _run(good, good, "--tol", "-1")
    assert code == 2 and "--tol must be" in err
