"""Stragglers at the plan service (docs/api.md, "Stragglers"), on real servers on
127.0.0.1: speed events from an operator, speeds measured from heartbeat compute times,
both published as plan versions for the job with those speeds, and kept across a restart."""
from __future__ import annotations

import re
import time

import httpx
import pytest

from api_support import ProcServer, ThreadServer, admin_headers, spec, register_job, token_client
from planner.plan import Plan
from planner.validate import validate

FAST, SLOW = 0.010, 0.020  # seconds per micro-batch: SLOW is half the speed


pytestmark = pytest.mark.procs  # its fixtures or tests start processes

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("speeds") / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=600, precompute_failures=0) as s:
        yield s


register, client = register_job, token_client


def speed(event_id, r, s, value, reason=None):
    body = {"event_id": event_id, "replica": r, "stage": s, "speed": value}
    if reason is not None:
        body["reason"] = reason
    return body


def nominal(D, S, **cells):
    """1.0 everywhere, except cells given as r{r}s{s}=v."""
    g = [[1.0] * S for _ in range(D)]
    for name, v in cells.items():
        r, s = name[1:].split("s")
        g[int(r)][int(s)] = v
    return g


def plan_of(c, jid):
    return c.get(f"/v1/jobs/{jid}/plan").json()


def metric(url, name, **labels):
    text = httpx.get(url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return None


def mbs(plan, r, s):
    """How many micro-batches worker (r, s) runs forward in `plan`."""
    w = [w for w in plan["workers"] if (w["replica"], w["stage"]) == (r, s)]
    return sum(a["op"] == "F" for a in w[0]["actions"]) if w else 0


def iterations(w, jid, times, start, n, repeat=2):
    """n iterations of heartbeats from every worker in `times` ((r, s) -> seconds per
    micro-batch), each sent `repeat` times (heartbeats repeat the last measurement: an
    iteration counts once). Returns the last answer."""
    last = None
    for it in range(start, start + n):
        for _ in range(repeat):
            for (r, s), t in times.items():
                last = w.post(f"/v1/jobs/{jid}/heartbeats", json={
                    "replica": r, "stage": s, "iteration": it + 1,
                    "compute_s_per_mb": t, "compute_iteration": it})
                assert last.status_code == 200, last.text
    return last.json()


def grid_times(D, S, **cells):
    return {(r, s): cells.get(f"r{r}s{s}", FAST) for r in range(D) for s in range(S)}


# ---- operator speeds ---------------------------------------------------------------------
def test_operator_speed_publishes_a_version_with_the_speed(admin, server):
    jid, token = register(admin, D=2, S=2, M=4)
    w = client(server.url, token)
    # a replacement first: speed versions must keep the incarnations
    r = w.post(f"/v1/jobs/{jid}/events", json={"event_id": "new", "kind": "recovery",
                                               "replica": 0, "stage": 1, "incarnation": 2})
    assert r.status_code == 200, r.text
    before = plan_of(admin, jid)
    assert before["version"] == 1 and before["job"]["speed"] is None

    r = admin.post(f"/v1/jobs/{jid}/speeds", json=speed("slow", 1, 0, 0.46, "thermal"))
    assert r.status_code == 200, r.text
    a = r.json()
    assert (a["kind"], a["source"], a["speed"], a["plan_version"]) == ("speed", "operator",
                                                                         0.5, 2)
    assert a["plan_source"] in ("cache", "greedy") and a["state"] == "running"
    assert a["failed"] == [] and a["incarnation"] == 1

    plan = plan_of(admin, jid)
    assert plan["version"] == 2 and plan["failed"] == []
    assert plan["job"]["speed"] == nominal(2, 2, r1s0=0.5)
    assert plan["incarnations"] == before["incarnations"] == [[1, 2], [1, 1]]
    validate(Plan.model_validate(plan))
    assert mbs(plan, 1, 0) < mbs(plan, 0, 0)  # the slow worker sheds micro-batches
    assert w.get(f"/v1/jobs/{jid}/workers/0/1/plan").json()["incarnation"] == 2

    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["speeds"] == nominal(2, 2, r1s0=0.5) and job["plan_version"] == 2
    assert job["spec"]["speed"] is None  # the registered spec stays as it was
    assert job["plans"][-1]["cause"] == "speed:operator"
    events = admin.get(f"/v1/jobs/{jid}/events").json()
    assert [(e["event_id"], e["kind"], e["speed"]) for e in events] == \
        [("new", "recovery", None), ("slow", "speed", 0.5)]
    assert admin.get(f"/v1/jobs/{jid}/speeds").json() == {
        "plan_version": 2, "speeds": nominal(2, 2, r1s0=0.5),
        "operator": [{"replica": 1, "stage": 0, "speed": 0.5}],
        "measured": nominal(2, 2)}
    assert metric(server.url, "recycle_slow_workers", job=jid) == 1
    assert metric(server.url, "recycle_events_total", kind="speed", source="operator",
                  outcome="accepted") >= 1

    # faster than nominal is allowed, quantised too; a worker token may post speeds
    r = w.post(f"/v1/jobs/{jid}/speeds", json=speed("fast", 0, 0, 2.04))
    assert r.status_code == 200 and r.json()["speed"] == 2.0 and r.json()["source"] == "worker"
    assert plan_of(admin, jid)["job"]["speed"] == [[2.0, 1.0], [0.5, 1.0]]

    # clearing both: back to nominal, in a new version each
    for i, (r_, s_) in enumerate(((1, 0), (0, 0))):
        r = admin.post(f"/v1/jobs/{jid}/speeds", json=speed(f"clear{i}", r_, s_, None))
        assert r.status_code == 200 and r.json()["speed"] == 1.0, r.text
    plan = plan_of(admin, jid)
    assert plan["version"] == 5 and plan["job"]["speed"] is None
    assert plan["incarnations"] == [[1, 2], [1, 1]]
    assert plan["metrics"]["period"] == before["metrics"]["period"]
    assert admin.get(f"/v1/jobs/{jid}").json()["speeds"] == nominal(2, 2)
    assert metric(server.url, "recycle_slow_workers", job=jid) == 0


def test_speed_events_are_idempotent(admin, server):
    jid, _ = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/speeds"
    first = admin.post(url, json=speed("s", 1, 1, 0.5))
    assert first.status_code == 200
    again = admin.post(url, json=speed("s", 1, 1, 0.5))
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert plan_of(admin, jid)["version"] == 1
    # the same id with another body, or the id of a failure event: 409, nothing changes
    for body in (speed("s", 1, 1, 0.6), speed("s", 1, 1, None), speed("s", 1, 0, 0.5)):
        r = admin.post(url, json=body)
        assert r.status_code == 409 and "different body" in r.json()["detail"], r.text
    assert admin.post(f"/v1/jobs/{jid}/events", json={
        "event_id": "f", "kind": "failure", "replica": 0, "stage": 0}).status_code == 200
    r = admin.post(url, json=speed("f", 0, 0, 0.5))
    assert r.status_code == 409
    r = admin.post(f"/v1/jobs/{jid}/events", json={
        "event_id": "s", "kind": "failure", "replica": 1, "stage": 1})
    assert r.status_code == 409
    # a setting that changes nothing is recorded without a new version
    r = admin.post(url, json=speed("same", 1, 1, 0.52))
    assert r.status_code == 200 and r.json()["plan_source"] is None
    assert r.json()["plan_version"] == 2 == plan_of(admin, jid)["version"]
    # a failed worker may get a speed (for when it rejoins); the plan keeps the failed set
    r = admin.post(url, json=speed("dead", 0, 0, 0.3))
    assert r.status_code == 200 and r.json()["failed"] == [[0, 0]]
    plan = plan_of(admin, jid)
    assert plan["failed"] == [[0, 0]] and plan["job"]["speed"] == [[0.3, 1.0], [1.0, 0.5]]
    assert [e["event_id"] for e in admin.get(f"/v1/jobs/{jid}/events").json()] == \
        ["s", "f", "same", "dead"]


def test_bad_speed_events_are_422_with_one_line(admin, server):
    jid, token = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/speeds"
    ok = speed("x", 1, 1, 0.5)
    cases = [
        ({**ok, "speed": 0}, "speed"), ({**ok, "speed": -0.5}, "speed"),
        ({**ok, "speed": 100.5}, "speed"), ({**ok, "speed": "0.5"}, "speed"),
        ({**ok, "speed": True}, "speed"), ({k: v for k, v in ok.items() if k != "speed"},
                                           "speed"),
        ({**ok, "replica": 2}, "outside"), ({**ok, "stage": 7}, "outside"),
        ({**ok, "replica": -1}, "replica"), ({**ok, "event_id": ""}, "event_id"),
        ({**ok, "kind": "speed"}, "kind"),
    ]
    for body, word in cases:
        r = admin.post(url, json=body)
        assert r.status_code == 422, (body, r.text)
        detail = r.json()["detail"]
        assert word in detail and "\n" not in detail, (body, detail)
    for raw in (b'{"event_id":"x","replica":1,"stage":1,"speed":NaN}',
                b'{"event_id":"x","replica":1,"stage":1,"speed":Infinity}',
                b'{"event_id":"x","replica":1,"stage":1,"speed":1e999}'):
        r = admin.post(url, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "\n" not in r.json()["detail"], r.text
    # tokens: none 401, another job's 403
    assert httpx.post(server.url + url, json=ok).status_code == 401
    other, other_token = register(admin, D=2, S=2, M=2)
    assert client(server.url, other_token).post(url, json=ok).status_code == 403
    assert plan_of(admin, jid)["version"] == 0
    assert admin.get(f"/v1/jobs/{jid}/events").json() == []


def test_speed_too_small_for_the_spec_is_422(admin, server):
    # durations near the bound: at speed 0.1 a plan's times could exceed 2**53
    big = 10**12
    jid, _ = register(admin, D=4, S=4, M=8, F=big, I=big, W=big, OPT=big)
    url = f"/v1/jobs/{jid}/speeds"
    r = admin.post(url, json=speed("tiny", 2, 2, 0.1))
    assert r.status_code == 422 and "too long" in r.json()["detail"], r.text
    assert "\n" not in r.json()["detail"]
    assert plan_of(admin, jid)["version"] == 0
    r = admin.post(url, json=speed("tiny", 2, 2, 0.5))  # rejected: the id is still free
    assert r.status_code == 200 and r.json()["plan_version"] == 1


def test_halted_and_finished_jobs_refuse_speeds(admin, server, tmp_path):
    # a service that plans for runs without snapshots halts (with them it would pause)
    with ThreadServer(tmp_path / "service.db", precompute_failures=0,
                      elastic_snapshots=False, elastic_disk=False) as plain, \
            httpx.Client(base_url=plain.url, headers=admin_headers(), timeout=10) as other:
        jid, token = register(other, D=1, S=2, M=2)
        assert other.post(f"/v1/jobs/{jid}/events", json={
            "event_id": "f", "kind": "failure", "replica": 0, "stage": 0}).json()["state"] == \
            "halted"
        r = other.post(f"/v1/jobs/{jid}/speeds", json=speed("s", 0, 1, 0.5))
    assert r.status_code == 409 and "halted" in r.json()["detail"]
    jid, token = register(admin, D=2, S=2, M=2)
    assert admin.post(f"/v1/jobs/{jid}/finish").status_code == 200
    r = admin.post(f"/v1/jobs/{jid}/speeds", json=speed("s", 0, 1, 0.5))
    assert r.status_code == 409 and "finished" in r.json()["detail"]


# ---- measured speeds ---------------------------------------------------------------------
def test_measured_straggler_slows_and_recovers(admin, server):
    jid, token = register(admin, D=2, S=2, M=4)
    w = client(server.url, token)
    v0 = plan_of(admin, jid)["version"]

    # between the thresholds (0.85 of the fastest: not below enter = 0.8): nothing changes
    hb = iterations(w, jid, grid_times(2, 2, r1s1=FAST / 0.85), 0, 4)
    assert hb["plan_version"] == v0
    # twice as slow: one iteration is a hiccup (the best of 3 ignores it) ...
    hb = iterations(w, jid, grid_times(2, 2, r1s1=SLOW), 4, 1)
    assert hb["plan_version"] == v0
    # ... a window's worth is a straggler: a new version with it at 0.5
    hb = iterations(w, jid, grid_times(2, 2, r1s1=SLOW), 5, 2)
    assert hb["plan_version"] == v0 + 1
    plan = plan_of(admin, jid)
    assert plan["job"]["speed"] == nominal(2, 2, r1s1=0.5)
    assert mbs(plan, 1, 1) < mbs(plan, 0, 1)
    assert admin.get(f"/v1/jobs/{jid}").json()["plans"][-1]["cause"] == "speed:detector"
    ev = admin.get(f"/v1/jobs/{jid}/events").json()[-1]
    assert (ev["kind"], ev["source"], ev["replica"], ev["stage"], ev["speed"]) == \
        ("speed", "detector", 1, 1, 0.5)
    assert metric(server.url, "recycle_slow_workers", job=jid) == 1

    # a little faster (0.6) is within two steps of 0.5: no flapping between levels
    hb = iterations(w, jid, grid_times(2, 2, r1s1=FAST / 0.6), 7, 4)
    assert hb["plan_version"] == v0 + 1
    # normal times again: back to nominal in a new version
    hb = iterations(w, jid, grid_times(2, 2), 11, 3)
    assert hb["plan_version"] == v0 + 2
    assert plan_of(admin, jid)["job"]["speed"] is None
    ev = admin.get(f"/v1/jobs/{jid}/events").json()
    assert [(e["source"], e["speed"]) for e in ev] == [("detector", 0.5), ("detector", 1.0)]
    assert metric(server.url, "recycle_slow_workers", job=jid) == 0
    assert metric(server.url, "recycle_events_total", kind="speed", source="detector",
                  outcome="accepted") >= 2


def test_operator_speed_takes_precedence_over_the_detector(admin, server):
    jid, token = register(admin, D=2, S=2, M=4)
    w = client(server.url, token)
    url = f"/v1/jobs/{jid}/speeds"
    iterations(w, jid, grid_times(2, 2, r0s0=SLOW), 0, 3)
    assert plan_of(admin, jid)["job"]["speed"] == nominal(2, 2, r0s0=0.5)
    v = plan_of(admin, jid)["version"]

    assert admin.post(url, json=speed("op", 0, 0, 0.7)).json()["speed"] == 0.7
    assert plan_of(admin, jid)["job"]["speed"] == nominal(2, 2, r0s0=0.7)
    # while it is set, measurements of that worker do not move its speed
    iterations(w, jid, grid_times(2, 2), 3, 3)
    iterations(w, jid, grid_times(2, 2, r0s0=SLOW), 6, 3)
    assert plan_of(admin, jid)["job"]["speed"] == nominal(2, 2, r0s0=0.7)
    speeds = admin.get(url).json()
    assert speeds["measured"] == nominal(2, 2, r0s0=0.5)
    assert speeds["operator"] == [{"replica": 0, "stage": 0, "speed": 0.7}]
    # cleared: the detector's measurement applies again
    r = admin.post(url, json=speed("clear", 0, 0, None))
    assert r.json()["speed"] == 0.5
    assert plan_of(admin, jid)["job"]["speed"] == nominal(2, 2, r0s0=0.5)
    assert plan_of(admin, jid)["version"] > v


def test_failure_forgets_the_measurement(admin, server):
    jid, token = register(admin, D=2, S=2, M=4)
    w = client(server.url, token)
    iterations(w, jid, grid_times(2, 2, r1s0=SLOW), 0, 3)
    assert plan_of(admin, jid)["job"]["speed"] == nominal(2, 2, r1s0=0.5)
    r = admin.post(f"/v1/jobs/{jid}/events", json={
        "event_id": "f", "kind": "failure", "replica": 1, "stage": 0})
    assert r.status_code == 200
    plan = plan_of(admin, jid)  # one version: the failure, at nominal speeds
    assert plan["version"] == r.json()["plan_version"] and plan["failed"] == [[1, 0]]
    assert plan["job"]["speed"] is None
    assert admin.get(f"/v1/jobs/{jid}/speeds").json()["measured"] == nominal(2, 2)
    # a failed worker's heartbeats (with times) are refused and measure nothing
    r = w.post(f"/v1/jobs/{jid}/heartbeats", json={"replica": 1, "stage": 0, "iteration": 9,
                                                   "compute_s_per_mb": SLOW})
    assert r.status_code == 409
    # the rejoined process starts with no history: slow again only after a full window
    r = admin.post(f"/v1/jobs/{jid}/events", json={
        "event_id": "r", "kind": "recovery", "replica": 1, "stage": 0})
    v = r.json()["plan_version"]
    assert iterations(w, jid, grid_times(2, 2, r1s0=SLOW), 3, 2)["plan_version"] == v
    assert iterations(w, jid, grid_times(2, 2, r1s0=SLOW), 5, 1)["plan_version"] == v + 1
    assert plan_of(admin, jid)["job"]["speed"] == nominal(2, 2, r1s0=0.5)
    # a replacement (a newer process of a live worker) forgets it too, in its one version
    r = w.post(f"/v1/jobs/{jid}/events", json={
        "event_id": "new", "kind": "recovery", "replica": 1, "stage": 0, "incarnation": 3})
    assert r.status_code == 200 and r.json()["plan_version"] == v + 2
    assert r.json()["plan_source"] in ("cache", "greedy")  # the speeds changed: re-planned
    plan = plan_of(admin, jid)
    assert plan["version"] == v + 2 and plan["job"]["speed"] is None
    assert plan["incarnations"] == [[1, 1], [3, 1]]
    assert admin.get(f"/v1/jobs/{jid}").json()["plans"][-1]["cause"] == "replacement:worker"


def test_bad_compute_times_are_422(admin, server):
    jid, token = register(admin, D=2, S=2, M=2)
    w = client(server.url, token)
    url = f"/v1/jobs/{jid}/heartbeats"
    base = {"replica": 0, "stage": 0, "iteration": 1}
    for bad in ({"compute_s_per_mb": -1.0}, {"compute_s_per_mb": "0.1"},
                {"compute_s_per_mb": True}, {"compute_s_per_mb": 1e7},
                {"compute_s_per_mb": 0.1, "compute_iteration": -1},
                {"compute_s_per_mb": 0.1, "compute_iteration": 2**63}):
        r = w.post(url, json={**base, **bad})
        assert r.status_code == 422 and "compute" in r.json()["detail"], r.text
    r = w.post(url, content=b'{"replica":0,"stage":0,"iteration":1,"compute_s_per_mb":NaN}',
               headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert w.post(url, json={**base, "compute_s_per_mb": 0}).status_code == 200


# ---- better plans later, restarts -------------------------------------------------------
def test_better_plans_later_keep_the_speeds(tmp_path):
    """Background CP-SAT (the improvement after a greedy answer, and precompute for the
    spec's own speeds) may only publish a plan for the failed set and speeds in force."""
    with ThreadServer(tmp_path / "s.db", heartbeat_timeout_s=600, precompute_failures=1,
                      solvers=("greedy", "cpsat"), cpsat_time_limit_s=1.0) as srv:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, _ = register(c, D=2, S=2, M=4)
        # at 0.7, CP-SAT beats greedy's period (145 against 147)
        r = c.post(f"/v1/jobs/{jid}/speeds", json=speed("s", 1, 0, 0.7))
        assert r.status_code == 200 and r.json()["plan_source"] == "greedy"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = c.get(f"/v1/jobs/{jid}").json()
            if job["precompute"]["state"] == "done" and \
                    any(p["cause"] == "improved:cpsat" for p in job["plans"]):
                break
            time.sleep(0.2)
        time.sleep(0.5)
        job = c.get(f"/v1/jobs/{jid}").json()
        assert job["precompute"]["state"] == "done"
        causes = [p["cause"] for p in job["plans"]]
        assert causes[:2] == ["registered", "speed:operator"], causes
        assert "improved:cpsat" in causes, causes  # a better plan for the speeds came
        for p in job["plans"][1:]:
            plan = c.get(f"/v1/jobs/{jid}/plans/{p['version']}").json()
            assert plan["job"]["speed"] == nominal(2, 2, r1s0=0.7), p
        assert job["plans"][-1]["period"] < job["plans"][1]["period"]


def test_speeds_survive_a_sigkill_restart(tmp_path):
    db = tmp_path / "service.db"
    args = ("--solvers", "greedy", "--max-failures", "0", "--heartbeat-timeout", "600")
    srv = ProcServer(db, *args).start()
    try:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, token = register(c, D=2, S=2, M=4)
        w = client(srv.url, token)
        first = c.post(f"/v1/jobs/{jid}/speeds", json=speed("op", 0, 1, 0.3)).json()
        iterations(w, jid, grid_times(2, 2, r1s1=SLOW), 0, 3)
        before = c.get(f"/v1/jobs/{jid}").json()
        assert before["speeds"] == nominal(2, 2, r0s1=0.3, r1s1=0.5)
        srv.kill()
        srv = ProcServer(db, *args, port=srv.port).start()
        after = c.get(f"/v1/jobs/{jid}").json()
        for key in ("speeds", "plan_version", "incarnations", "plans"):
            assert after[key] == before[key], key
        speeds = c.get(f"/v1/jobs/{jid}/speeds").json()
        assert speeds["operator"] == [{"replica": 0, "stage": 1, "speed": 0.3}]
        assert speeds["measured"] == nominal(2, 2, r1s1=0.5)
        again = c.post(f"/v1/jobs/{jid}/speeds", json=speed("op", 0, 1, 0.3))
        assert again.json() == first and again.headers["Idempotent-Replayed"] == "true"
        # the restored detector level can still go back to nominal, the setting stays
        v = after["plan_version"]
        assert iterations(w, jid, grid_times(2, 2), 10, 3)["plan_version"] == v + 1
        assert plan_of(c, jid)["job"]["speed"] == nominal(2, 2, r0s1=0.3)
        c.post(f"/v1/jobs/{jid}/speeds", json=speed("clear", 0, 1, None)).raise_for_status()
        assert plan_of(c, jid)["job"]["speed"] is None
    finally:
        srv.stop()
