"""`--snapshot-every auto` may choose no snapshots (the copies exceed the memory budget,
executor/runtime/peer_snapshots/cadence.py): the membership, which took them as on until
K was chosen, must learn it (issue 42, item 4), locally (the coordinator reads the choice)
and through the service (the run's progress reports snapshot_every 0). Otherwise it plans
restores from snapshots nobody holds and counts no stage as a halt risk."""
import json
import subprocess
import sys

import httpx
import pytest

from api_support import ThreadServer, admin_headers, register_job, token_client
from executor.launch.coordinator.publishing import Plans
from executor.launch.report.run_record import RunRecord
from planner.control.membership import Membership
from planner.job import JobSpec
from planner.plan import Mode


def plans(**kw):
    job = JobSpec.uniform(2, 2, 4)
    members = Membership.start(2, 2, job=job, horizon=1e9, pause=True, **kw)
    events = []
    return Plans(None, job, members, solver="greedy", mode=Mode(), record=RunRecord(),
                 event=events.append), events


def test_the_coordinator_hands_auto_choosing_off_to_the_membership():
    p, events = plans(snapshots=True, disk=True)
    p.snapshots_chosen(3)  # a K: snapshots on, as taken
    assert p.members.snapshots and events == []
    p.snapshots_chosen(0)
    assert not p.members.snapshots and p.members.disk
    assert events == ["the membership plans without peer-memory snapshots from now on: a "
                      "stage that loses every worker restores from a disk checkpoint or the "
                      "seed"]
    p.snapshots_chosen(0)  # said once
    assert len(events) == 1
    p, events = plans(snapshots=True)
    p.snapshots_chosen(0)
    assert events[-1].endswith("a stage that loses every worker halts the run")


# ---- the service: the run's progress says what auto chose ----------------------------------
def ev(event_id, kind, r, s):
    return {"event_id": event_id, "kind": kind, "replica": r, "stage": s}


def _lose_stage_1(admin, server, progress, shape="fixed"):
    jid, token = register_job(admin, shape=shape, D=2, S=2, M=2)
    if progress is not None:
        with token_client(server.url, token) as w:
            r = w.post(f"/v1/jobs/{jid}/progress", json={"iteration": 4, "loss": 1.0,
                                                          "snapshot_every": progress})
            assert r.status_code == 200, r.text
    url = f"/v1/jobs/{jid}/events"
    assert admin.post(url, json=ev("a", "failure", 0, 1)).json()["state"] == "running"
    return jid, admin.post(url, json=ev("b", "failure", 1, 1)).json()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    with ThreadServer(d / "a.db", heartbeat_timeout_s=30, precompute_failures=0,
                      elastic_disk=False) as plain, \
            ThreadServer(d / "b.db", heartbeat_timeout_s=30, precompute_failures=0,
                         elastic_disk=True) as disk:
        yield plain, disk


@pytest.mark.procs  # its servers start solver processes
def test_a_run_reporting_no_snapshots_halts_a_stage_lost_whole_naming_it(servers):
    plain, _ = servers
    with httpx.Client(base_url=plain.url, headers=admin_headers(), timeout=10) as admin:
        # before K is known, and with a K: a stage lost whole is restored from peer memory
        for progress in (None, 3):
            jid, r = _lose_stage_1(admin, plain, progress)
            assert r["state"] == "running", r
            moves = admin.get(f"/v1/jobs/{jid}/plan").json()["moves"]
            assert [(m["to_stage"], m["source"]) for m in moves] == [(1, "snapshot")], moves
        # auto chose off (or the run has them off): nobody holds a snapshot of stage 1
        jid, r = _lose_stage_1(admin, plain, 0)
        assert r["state"] == "halted", r
        assert r["reason"].startswith("stage 1 has no live replica and no snapshot"), r
        assert not plain.service.jobs[jid].members.snapshots


@pytest.mark.procs  # its servers start solver processes
def test_with_a_disk_tier_a_run_without_snapshots_still_restores_a_stage_lost_whole(servers):
    _, disk = servers
    with httpx.Client(base_url=disk.url, headers=admin_headers(), timeout=10) as admin:
        jid, r = _lose_stage_1(admin, disk, 0)
        assert r["state"] == "running", r
        members = disk.service.jobs[jid].members
        assert not members.snapshots and members.disk
        # and one live worker of two stages pauses (nothing lost), it does not halt
        r = admin.post(f"/v1/jobs/{jid}/events", json=ev("c", "failure", 0, 0)).json()
        assert r["state"] == "paused" and r["reason"] == "1 live worker cannot serve 2 stages", r


def test_serve_has_the_disk_tier_switch_both_ways():
    from typer.testing import CliRunner

    from recycle.cli import app
    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "--elastic-disk" in out and "--no-elastic-disk" in out, out


# ---- a local run: auto chooses off within a tiny memory budget -----------------------------
@pytest.mark.hard_timeout(300)
def test_auto_choosing_off_reaches_the_membership_and_the_run_stays_exact(tmp_path):
    grid = ["-d", "2", "-s", "2", "-m", "4", "--iterations", "10"]

    def train(name, *args):
        summary = tmp_path / f"{name}.json"
        r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *grid, *args,
                            "--summary", str(summary), "--run-dir", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=200)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(summary.read_text()), r.stderr

    got, out = train("run", "--snapshot-memory", "1K", "--kill", "0:1@6", "--kill", "1:1@7")
    assert got["elastic"]["snapshot_every"] == 0, got["elastic"]
    said = " ".join(out.split())  # the console wraps its lines
    assert "peer-memory snapshots off" in said, out
    assert ("the membership plans without peer-memory snapshots from now on: a stage that "
            "loses every worker restores from a disk checkpoint or the seed") in said, out
    ref, _ = train("ref", "--reference")
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert len(got["losses"]) == len(ref["losses"]) == 10 and worst <= 1e-5, (worst, out)
