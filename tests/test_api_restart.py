"""kill -9 the service (a real subprocess) and restart it on the same SQLite file."""
from __future__ import annotations

import pytest
import threading
import time

import httpx

from api_support import ProcServer, admin_headers, spec
from executor.sources.http_source import HttpPlanSource


pytestmark = pytest.mark.procs  # its fixtures or tests start processes

def ev(event_id, kind, r, s):
    return {"event_id": event_id, "kind": kind, "replica": r, "stage": s}


def state_of(c: httpx.Client, jid: str) -> dict:
    job = c.get(f"/v1/jobs/{jid}").json()
    job.pop("precompute")  # progresses in the background
    plans = [c.get(f"/v1/jobs/{jid}/plans/{p['version']}").json() for p in job["plans"]]
    return {"job": job, "events": c.get(f"/v1/jobs/{jid}/events").json(), "plans": plans}


def test_sigkill_and_restart_keeps_everything(tmp_path):
    db = tmp_path / "service.db"
    # without snapshots a stage lost whole halts job b (with them, the default, it moves)
    args = ("--solvers", "greedy", "--max-failures", "1", "--heartbeat-timeout", "30",
            "--no-elastic-snapshots", "--no-elastic-disk")
    srv = ProcServer(db, *args).start()
    try:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jobs = {}
        for name, kw in (("a", {}), ("b", {"D": 2, "S": 2, "M": 2})):
            r = c.post("/v1/jobs", json=spec(**kw)).json()
            jobs[name] = (r["id"], r["token"])
        a, token = jobs["a"]
        b = jobs["b"][0]
        for e in (ev("1", "failure", 0, 0), ev("2", "failure", 1, 3), ev("3", "recovery", 0, 0)):
            c.post(f"/v1/jobs/{a}/events", json=e).raise_for_status()
        c.post(f"/v1/jobs/{b}/events", json=ev("x", "failure", 0, 1)).raise_for_status()
        c.post(f"/v1/jobs/{b}/events", json=ev("y", "failure", 1, 1)).raise_for_status()

        # A stream of events, killed mid-way: every acknowledged one must survive.
        acked, stop = [], threading.Event()

        def stream():
            with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=5) as s:
                for i in range(10_000):
                    kind = "failure" if i % 2 == 0 else "recovery"
                    try:
                        r = s.post(f"/v1/jobs/{a}/events", json=ev(f"s{i}", kind, 2, 2))
                    except httpx.HTTPError:
                        return
                    if r.status_code == 200:
                        acked.append(f"s{i}")
                    if stop.is_set():
                        return

        t = threading.Thread(target=stream)
        t.start()
        while len(acked) < 10:
            time.sleep(0.01)
        before = {j: state_of(c, jobs[j][0]) for j in jobs}
        srv.kill()
        stop.set()
        t.join(10)
        n_acked = len(acked)

        # a worker long-polling across the outage rides it out and gets the next version
        src = HttpPlanSource(srv.url, a, token)
        got = {}
        v0 = before["a"]["job"]["plan_version"]
        poller = threading.Thread(target=lambda: got.setdefault("p1", src.wait_for_plan(v0, 30)))
        poller.start()
        time.sleep(0.3)  # it is retrying against a dead port now
        srv.start()
        poller.join(10)
        assert got["p1"].version > v0
        after_a = state_of(c, a)
        ids = [e["event_id"] for e in after_a["events"]]
        assert set(acked) <= set(ids)
        # the job's state matches the last event on disk (an ack may have been lost in
        # flight, never an event)
        last = after_a["events"][-1]
        assert after_a["job"]["failed"] == last["failed"]
        assert after_a["job"]["plan_version"] == last["plan_version"]
        versions = [p["version"] for p in after_a["plans"]]
        assert versions == list(range(len(versions)))
        # everything from before the stream is byte-for-byte the same
        assert after_a["plans"][:len(before["a"]["plans"])] == before["a"]["plans"]
        assert after_a["events"][:len(before["a"]["events"])] == before["a"]["events"]
        assert state_of(c, b) == before["b"]
        assert c.get(f"/v1/jobs/{b}/plan").status_code == 410

        # idempotency survives the restart; versions keep growing; tokens still work
        r = c.post(f"/v1/jobs/{a}/events", json=ev("2", "failure", 1, 3))
        assert r.status_code == 200 and r.json() == before["a"]["events"][1]
        src2 = HttpPlanSource(srv.url, a, token)
        v = after_a["job"]["plan_version"]
        poller2 = threading.Thread(target=lambda: got.setdefault("p2", src2.wait_for_plan(v, 20)))
        poller2.start()
        time.sleep(0.2)
        r = c.post(f"/v1/jobs/{a}/events", json=ev("after", "failure", 3, 0))
        assert r.status_code == 200 and r.json()["plan_version"] == v + 1
        poller2.join(10)
        assert got["p2"].version == v + 1 and (3, 0) in got["p2"].failed
        assert n_acked >= 10
        src.close()
        src2.close()
    finally:
        srv.stop()


def _procs() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) of every process, from /proc/*/stat."""
    import os
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        out[int(name)] = (int(fields[1]), fields[0], fields[19])
    return out


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live process below `root`."""
    procs = _procs()
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, state, start) in procs.items():
            if ppid == parent and pid not in found and state != "Z":
                found[pid] = start
                frontier.append(pid)
    return found


def test_sigkill_leaves_no_solver_processes_behind(tmp_path):
    """Regression: `recycle serve` SIGKILLed left its solver pool and multiprocessing's
    resource tracker running forever under pid 1."""
    import os
    import signal
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--solver-workers", "2").start()
    children = {}
    try:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid = c.post("/v1/jobs", json=spec(D=2, S=2, M=2)).json()["id"]
        deadline = time.monotonic() + 60
        while c.get(f"/v1/jobs/{jid}/precompute").json()["state"] != "done":
            assert time.monotonic() < deadline, "precompute did not finish"
            time.sleep(0.1)
        children = _descendants(srv.proc.pid)
        cmds = []
        for pid in children:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmds.append(fh.read().replace(b"\0", b" ").decode())
        # a pool worker and multiprocessing's resource tracker
        assert any("resource_tracker" in c for c in cmds), cmds
        assert any("spawn_main" in c for c in cmds), cmds
        srv.kill()
        deadline = time.monotonic() + 5
        while True:
            procs = _procs()
            alive = {pid for pid, start in children.items()
                     if pid in procs and procs[pid][2] == start and procs[pid][1] != "Z"}
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not alive, f"left running after the service was SIGKILLed: {sorted(alive)}"
    finally:
        srv.stop()
        procs = _procs()
        for pid, start in children.items():  # only what this test's server started
            if pid in procs and procs[pid][2] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def test_a_finished_job_stays_finished_across_a_restart(tmp_path):
    """POST /finish is idempotent, and a finished job is never declared failed or halted
    by the heartbeat monitor afterwards: its workers exit without being watched, also
    when the service restarts (armed workers are re-armed only for running jobs)."""
    timeout = 0.8
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "0",
                     "--heartbeat-timeout", str(timeout)).start()
    try:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        r = c.post("/v1/jobs", json=spec(D=2, S=2, M=2)).json()
        jid, token = r["id"], r["token"]
        w = httpx.Client(base_url=srv.url, timeout=10,
                         headers={"Authorization": f"Bearer {token}"})
        for rs in ((0, 0), (0, 1), (1, 0), (1, 1)):  # every worker armed
            hb = {"replica": rs[0], "stage": rs[1], "iteration": 5}
            assert w.post(f"/v1/jobs/{jid}/heartbeats", json=hb).status_code == 200
        first = w.post(f"/v1/jobs/{jid}/finish")
        assert first.status_code == 200 and first.json()["state"] == "finished"
        assert w.post(f"/v1/jobs/{jid}/finish").json() == first.json()

        def still_finished():
            job = c.get(f"/v1/jobs/{jid}").json()
            assert (job["state"], job["reason"], job["plan_version"], job["failed"]) == \
                ("finished", None, 0, [])
            assert c.get(f"/v1/jobs/{jid}/events").json() == []
            # a late suspect report about an exiting peer declares nobody failed
            r = w.post(f"/v1/jobs/{jid}/suspects", json={"replica": 1, "stage": 1})
            assert r.status_code == 200 and r.json()["declared_failed"] is False
            r = w.post(f"/v1/jobs/{jid}/events", json=ev("late", "failure", 0, 0))
            assert r.status_code == 409 and "finished" in r.json()["detail"]
            r = w.post(f"/v1/jobs/{jid}/heartbeats",
                       json={"replica": 0, "stage": 0, "iteration": 6})
            assert r.status_code == 200 and r.json()["state"] == "finished"

        time.sleep(timeout * 2.5)  # every worker silent past the timeout
        still_finished()
        srv.kill()
        srv.start()
        time.sleep(timeout * 2.5)
        still_finished()
        assert w.post(f"/v1/jobs/{jid}/finish").json() == first.json()
        assert c.get(f"/v1/jobs/{jid}/plan").status_code == 200  # not 410: never halted
    finally:
        srv.stop()
