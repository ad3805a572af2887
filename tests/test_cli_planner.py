"""The `recycle` command as a user runs it: real subprocesses, real files."""
import json
import os
import subprocess
import sys

import pytest

from planner.plan import Plan
from planner.validate import validate

pytestmark = pytest.mark.procs  # its fixtures or tests start processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = {
    "replicas": 4, "stages": 4, "microbatches": 8,
    "cost": {"F": [10, 10, 10, 12], "I": [10, 10, 10, 12], "W": [8, 8, 8, 9], "OPT": [5, 5, 5, 5]},
    "p2p": {"intra": 1, "cross": 2},
    "memory": {"activation": [4, 4, 4, 4], "capacity": [40, 40, 40, 40]},
}


def recycle(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "recycle.cli", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=120)


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(SPEC))
    return str(path)


def test_plan_json_and_gantt(spec, tmp_path):
    gantt = tmp_path / "g.html"  # CSV export: tests/test_interop.py
    r = recycle("plan", spec, "--fail", "1:2", "--json", "--gantt", str(gantt))
    assert r.returncode == 0, r.stderr
    plan = Plan.from_json(r.stdout)
    assert validate(plan) == [] and plan.failed == [(1, 2)]
    assert "<svg" in gantt.read_text()


def test_plan_table(spec):
    r = recycle("plan", spec, "--fail", "0:0", "--solver", "1f1b")
    assert r.returncode == 0, r.stderr
    assert "period" in r.stdout and "lower bound" in r.stdout and "idle" in r.stdout


def _bad(spec_edit):
    data = json.loads(json.dumps(SPEC))
    spec_edit(data)
    return data


BAD_SPECS = {
    "negative duration": (_bad(lambda d: d["cost"]["F"].__setitem__(0, -1)), "cost.F.0"),
    "fractional duration": (_bad(lambda d: d["cost"]["W"].__setitem__(1, 8.5)), "cost.W.1"),
    "wrong list length": (_bad(lambda d: d["cost"]["I"].pop()), "cost.I has 3 entries"),
    "capacity below one activation": (_bad(lambda d: d["memory"].__setitem__("capacity", [1, 40, 40, 40])), "capacity"),
    "unknown field": (_bad(lambda d: d.__setitem__("stagez", 3)), "stagez"),
}


@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_bad_spec_is_one_line_exit_2(name, tmp_path):
    data, needle = BAD_SPECS[name]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    r = recycle("plan", str(path))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: ") and needle in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--fail", "9:0"], "outside the 4x4 grid"),
    (["--fail", "one:two"], "expected REPLICA:STAGE"),
    (["--solver", "magic"], "unknown solver"),
])
def test_bad_arguments_are_one_line_exit_2(spec, args, needle):
    r = recycle("plan", spec, *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_malformed_json_and_missing_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"replicas": 4, ')
    r = recycle("plan", str(path))
    assert r.returncode == 2 and "Invalid JSON" in r.stderr and "Traceback" not in r.stderr
    r = recycle("plan", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_no_live_replica_is_a_clear_outcome(spec):
    r = recycle("plan", spec, *sum((["--fail", f"{d}:3"] for d in range(4)), []), "--json")
    assert r.returncode == 3
    assert json.loads(r.stdout) == {"outcome": "restore_from_checkpoint", "reason":
                                    "no plan: stage 3 has no live replica, restore from checkpoint"}


def test_precompute_fills_the_cache(spec, tmp_path):
    db = tmp_path / "plans.sqlite"
    r = recycle("precompute", spec, "--max-failures", "1", "--db", str(db), "--solver", "greedy")
    assert r.returncode == 0, r.stderr
    assert "5 canonical failed sets" in r.stdout  # none, and one failure in each of 4 stages
    r = recycle("precompute", spec, "-k", "1", "--db", str(db), "--solver", "nope")
    assert r.returncode == 2 and "unknown solver" in r.stderr


def test_validate_command(spec, tmp_path):
    out = tmp_path / "plan.json"
    assert recycle("plan", spec, "--out", str(out)).returncode == 0
    r = recycle("validate", str(out))
    assert r.returncode == 0 and "valid" in r.stdout


def test_plan_with_roles_shows_the_moves_and_writes_them(spec, tmp_path):
    r = recycle("plan", spec, "--fail", "0:1", "--fail", "1:1", "--fail", "2:1", "--roles")
    assert r.returncode == 0, r.stderr
    assert "move " in r.stdout and "-> stage 1" in r.stdout and "no role choice beats" in r.stdout
    r = recycle("plan", spec, "--fail", "0:1", "--fail", "1:1", "--fail", "2:1", "--roles",
                "--join", "n7", "--json")
    assert r.returncode == 0, r.stderr
    plan = Plan.from_json(r.stdout)
    assert validate(plan) == [] and len(plan.roles) == 14
    assert any(m.worker == "n7" and m.from_stage is None for m in plan.moves)
    # every stage lost but one worker left per stage... too few workers: no plan, exit 3
    fails = [a for d in range(4) for s in range(4) if (d, s) != (0, 0) for a in ("--fail", f"{d}:{s}")]
    r = recycle("plan", spec, *fails, "--roles")
    assert r.returncode != 0 and "cannot serve" in r.stdout + r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--join", "x"], "need --roles"),
    (["--roles", "--horizon", "0"], "--horizon must be positive"),
    (["--roles", "--join", "0.0"], "already live"),
])
def test_bad_role_arguments_are_one_line_exit_2(spec, args, needle):
    r = recycle("plan", spec, *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
