"""kill -9 the service (a real subprocess) and restart it on the same SQLite file."""
from __future__ import annotations

import threading
import time

import httpx

from api_support import ProcServer, admin_headers, spec
from executor.http_source import HttpPlanSource


def ev(event_id, kind, r, s):
    return {"event_id": event_id, "kind": kind, "replica": r, "stage": s}


def state_of(c: httpx.Client, jid: str) -> dict:
    job = c.get(f"/v1/jobs/{jid}").json()
    job.pop("precompute")  # progresses in the background
    plans = [c.get(f"/v1/jobs/{jid}/plans/{p['version']}").json() for p in job["plans"]]
    return {"job": job, "events": c.get(f"/v1/jobs/{jid}/events").json(), "plans": plans}


def test_sigkill_and_restart_keeps_everything(tmp_path):
    db = tmp_path / "service.db"
    args = ("--solvers", "greedy", "--max-failures", "1", "--heartbeat-timeout", "30")
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
