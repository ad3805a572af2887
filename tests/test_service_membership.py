"""Incarnations at the plan service (docs/api.md, "Incarnations"), on real servers on
127.0.0.1: only the worker process a plan version names may enter it."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from api_support import ProcServer, ThreadServer, admin_headers, register_job, token_client
from planner.job import JobSpec
from planner.plan import Plan
from planner.validate import validate

pytestmark = pytest.mark.procs  # its fixtures or tests start processes

HB_TIMEOUT = 0.6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("membership") / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=HB_TIMEOUT, precompute_failures=1) as s:
        yield s


register, client = register_job, token_client


def recovery(event_id, r, s, incarnation=None):
    body = {"event_id": event_id, "kind": "recovery", "replica": r, "stage": s}
    if incarnation is not None:
        body["incarnation"] = incarnation
    return body


def failure(event_id, r, s, incarnation=None):
    return {**recovery(event_id, r, s, incarnation), "kind": "failure"}


def beat(c, jid, r, s, incarnation=None):
    body = {"replica": r, "stage": s, "iteration": 0}
    if incarnation is not None:
        body["incarnation"] = incarnation
    return c.post(f"/v1/jobs/{jid}/heartbeats", json=body)


def grid(D, S, **cells):
    """All ones, except cells given as r{r}s{s}=k."""
    g = [[1] * S for _ in range(D)]
    for name, k in cells.items():
        r, s = name[1:].split("s")
        g[int(r)][int(s)] = k
    return g


def test_versions_are_stamped_from_registration(admin, server):
    jid, token = register(admin, D=2, S=2, M=2)
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["version"] == 0 and plan["incarnations"] == grid(2, 2)
    assert admin.get(f"/v1/jobs/{jid}").json()["incarnations"] == grid(2, 2)
    w = client(server.url, token).get(f"/v1/jobs/{jid}/workers/1/0/plan").json()
    assert w["incarnation"] == 1 and w["in_plan"]


def test_replacement_of_a_live_worker_publishes_one_version(admin, server):
    jid, token = register(admin)
    w = client(server.url, token)
    url = f"/v1/jobs/{jid}/events"
    assert admin.post(url, json=failure("f", 0, 0)).status_code == 200
    before = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert before["version"] == 1

    r = w.post(url, json=recovery("new-1-2", 1, 2, incarnation=2))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["kind"] == "recovery" and answer["state"] == "running"
    assert answer["failed"] == [[0, 0]] and answer["plan_version"] == 2
    assert answer["incarnation"] == 2 and answer["source"] == "worker"

    plan = w.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["version"] == 2 and plan["failed"] == [[0, 0]]
    assert plan["incarnations"] == grid(4, 4, r1s2=2)
    # the same schedule, only the membership changed; still a valid plan
    assert plan["workers"] == before["workers"] and plan["routes"] == before["routes"]
    validate(Plan.model_validate(plan))
    # every way of reading it serves the stamped bytes: fast path, route, past versions
    fast = w.get(f"/v1/jobs/{jid}/plan?after=1&wait=1")
    slow = w.get(f"/v1/jobs/{jid}/plan?after=1&wait=1&x=1")
    past = w.get(f"/v1/jobs/{jid}/plans/2")
    assert fast.content == slow.content == past.content
    assert fast.json()["incarnations"] == plan["incarnations"]
    view = w.get(f"/v1/jobs/{jid}/workers/1/2/plan?after=1&wait=1").json()
    assert view["version"] == 2 and view["incarnation"] == 2 and view["in_plan"]
    assert w.get(f"/v1/jobs/{jid}/workers/1/1/plan").json()["incarnation"] == 1
    # recorded: the event log and the version's cause
    events = admin.get(url).json()
    assert [(e["event_id"], e["kind"], e["incarnation"]) for e in events] == \
        [("f", "failure", 1), ("new-1-2", "recovery", 2)]
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["plans"][-1]["cause"] == "replacement:worker"
    assert job["incarnations"] == plan["incarnations"] and job["plan_version"] == 2


def test_stale_membership_events_are_409_and_change_nothing(admin, server):
    jid, _ = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/events"
    assert admin.post(url, json=recovery("r3", 1, 1, incarnation=3)).status_code == 200
    cases = [
        (recovery("a", 1, 1, incarnation=3), "incarnation 3 is not newer than 3"),
        (recovery("b", 1, 1, incarnation=2), "incarnation 2 is not newer than 3"),
        (recovery("c", 1, 1), "is live"),
        (failure("d", 1, 1, incarnation=2), "superseded by 3"),
    ]
    for body, why in cases:
        r = admin.post(url, json=body)
        assert r.status_code == 409 and why in r.json()["detail"], (body, r.text)
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["plan_version"] == 1 and job["failed"] == []
    assert [e["event_id"] for e in admin.get(url).json()] == ["r3"]

    # a failure of the incarnation in the plan is accepted; then a recovery must not be
    # older than it, and one without an incarnation admits the next one
    r = admin.post(url, json=failure("e", 1, 1, incarnation=3))
    assert r.status_code == 200 and r.json()["failed"] == [[1, 1]]
    r = admin.post(url, json=recovery("g", 1, 1, incarnation=2))
    assert r.status_code == 409 and "incarnation 2 is older than 3" in r.json()["detail"]
    r = admin.post(url, json=recovery("h", 1, 1))
    assert r.status_code == 200 and r.json()["incarnation"] == 4 and r.json()["failed"] == []
    assert admin.get(f"/v1/jobs/{jid}/plan").json()["incarnations"] == grid(2, 2, r1s1=4)
    # a failed worker rejoins with the incarnation it names
    admin.post(url, json=failure("i", 0, 1)).raise_for_status()
    r = admin.post(url, json=recovery("j", 0, 1, incarnation=7))
    assert r.status_code == 200 and r.json()["incarnation"] == 7
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["version"] == 5 and plan["incarnations"] == [[1, 7], [1, 4]]


def test_incarnation_is_a_strict_bounded_int(admin):
    jid, _ = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/events"
    for bad in (0, -1, 2**31 + 1, 10**30, "2", True, 2.0):
        r = admin.post(url, json=recovery("x", 1, 1, incarnation=bad))
        assert r.status_code == 422 and "incarnation" in r.json()["detail"], (bad, r.text)
        r = beat(admin, jid, 1, 1, incarnation=bad)
        assert r.status_code == 422 and "incarnation" in r.json()["detail"], (bad, r.text)
    assert admin.post(url, json=recovery("x", 1, 1, incarnation=2**31)).status_code == 200
    assert admin.get(url).json()[0]["incarnation"] == 2**31


def test_idempotent_replay_of_a_replacement(admin, server):
    jid, _ = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/events"
    first = admin.post(url, json=recovery("rejoin-0.1-2", 0, 1, incarnation=2))
    assert first.status_code == 200 and first.json()["plan_version"] == 1
    again = admin.post(url, json=recovery("rejoin-0.1-2", 0, 1, incarnation=2))
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    # still the stored answer after the membership moved on
    admin.post(url, json=recovery("rejoin-0.1-3", 0, 1, incarnation=3)).raise_for_status()
    late = admin.post(url, json=recovery("rejoin-0.1-2", 0, 1, incarnation=2))
    assert late.status_code == 200 and late.json() == first.json()
    other = admin.post(url, json=recovery("rejoin-0.1-2", 0, 1, incarnation=5))
    assert other.status_code == 409 and "different body" in other.json()["detail"]
    # one version per accepted event, the newest admitting incarnation 3
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert [p["version"] for p in job["plans"]] == [0, 1, 2]
    assert job["incarnations"] == grid(2, 2, r0s1=3)


def test_heartbeats_of_other_incarnations_are_409_and_do_not_keep_a_worker_alive(admin,
                                                                                 server):
    jid, token = register(admin, D=2, S=2, M=2)
    w = client(server.url, token)
    url = f"/v1/jobs/{jid}/events"
    w.post(url, json=recovery("rep", 1, 0, incarnation=2)).raise_for_status()
    ok = beat(w, jid, 1, 0, incarnation=2)
    assert ok.status_code == 200 and ok.json()["incarnation"] == 2
    assert beat(w, jid, 1, 0).json()["incarnation"] == 2  # no incarnation: as before
    t0 = time.perf_counter()
    stale = beat(w, jid, 1, 0, incarnation=1)
    assert stale.status_code == 409 and "superseded" in stale.json()["detail"]
    newer = beat(w, jid, 1, 0, incarnation=3)
    assert newer.status_code == 409 and "post a recovery event first" in newer.json()["detail"]
    # incarnation 2 is silent now; 1 and 3 keep beating, which must not re-arm it
    declared = None
    while time.perf_counter() - t0 < HB_TIMEOUT + 3:
        for k in (1, 3):
            assert beat(w, jid, 1, 0, incarnation=k).status_code in (409,)
        r = w.get(f"/v1/jobs/{jid}/plan", params={"after": 1, "wait": 0.1})
        if r.status_code == 200:
            declared = time.perf_counter() - t0
            break
    assert declared is not None and declared < HB_TIMEOUT + 1.5, declared
    plan = r.json()
    assert plan["failed"] == [[1, 0]] and plan["incarnations"] == grid(2, 2, r1s0=2)
    last = admin.get(url).json()[-1]
    assert (last["source"], last["kind"], last["incarnation"]) == ("heartbeat", "failure", 2)
    # the newer process rejoins by its recovery event, then its heartbeats count
    assert beat(w, jid, 1, 0, incarnation=3).status_code == 409  # marked failed
    w.post(url, json=recovery("rejoin", 1, 0, incarnation=3)).raise_for_status()
    assert beat(w, jid, 1, 0, incarnation=3).status_code == 200
    assert beat(w, jid, 1, 0, incarnation=2).status_code == 409


def test_worker_plan_answers_a_superseded_incarnation_409(admin, server):
    jid, token = register(admin, D=2, S=2, M=2)
    w = client(server.url, token)
    base = f"/v1/jobs/{jid}/workers/1/1/plan"
    for extra in ("", "&x=1"):  # the fast path, and the FastAPI route
        r = w.get(f"{base}?incarnation=1{extra}")
        assert r.status_code == 200 and r.json()["incarnation"] == 1
        r = w.get(f"{base}?incarnation=2{extra}")  # newer: gets the plan, waits for its own
        assert r.status_code == 200 and r.json()["incarnation"] == 1
    assert w.get(f"{base}?incarnation=0").status_code == 422
    assert w.get(f"{base}?incarnation=x").status_code == 422

    # a long-poll of incarnation 1 parked when incarnation 2 replaces it: 409, not the plan
    got = {}

    def poll():
        got["r"] = client(server.url, token).get(f"{base}?after=0&wait=10&incarnation=1")

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    w.post(f"/v1/jobs/{jid}/events", json=recovery("rep", 1, 1, incarnation=2)).raise_for_status()
    t.join(10)
    assert got["r"].status_code == 409 and "superseded" in got["r"].json()["detail"]
    for extra in ("", "&x=1"):
        r = w.get(f"{base}?incarnation=1{extra}")
        assert r.status_code == 409 and "superseded by incarnation 2" in r.json()["detail"]
        r = w.get(f"{base}?incarnation=2{extra}")
        assert r.status_code == 200 and r.json()["incarnation"] == 2 and r.json()["version"] == 1
    assert w.get(f"/v1/jobs/{jid}/plan?incarnation=1").status_code == 200  # not worker-scoped


def test_resync_and_improved_plans_keep_the_incarnations(tmp_path):
    """Versions the service publishes on its own (a resync after a suspect that stayed
    alive, a better plan from CP-SAT) carry the job's incarnations too."""
    job = {"replicas": 2, "stages": 2, "microbatches": 2,
           "cost": {"F": [8, 1], "I": [7, 7], "W": [10, 1], "OPT": [12, 8]},
           "p2p": {"intra": 1, "cross": 3}}  # greedy 74 with (0, 1) failed, CP-SAT 73
    JobSpec.model_validate(job)
    with ThreadServer(tmp_path / "s.db", heartbeat_timeout_s=HB_TIMEOUT,
                      solvers=("greedy", "cpsat"), cpsat_time_limit_s=5) as srv:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid = c.post("/v1/jobs?max_failures=0", json=job).json()["id"]
        url = f"/v1/jobs/{jid}/events"
        assert c.post(url, json=failure("f", 0, 1)).json()["plan_source"] == "greedy"
        c.post(url, json=recovery("rep", 1, 0, incarnation=2)).raise_for_status()
        deadline = time.monotonic() + 60
        while True:
            causes = [p["cause"] for p in c.get(f"/v1/jobs/{jid}").json()["plans"]]
            if "improved:cpsat" in causes or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert causes[:3] == ["registered", "failure:operator", "replacement:operator"]
        assert causes[3:] == ["improved:cpsat"], causes
        improved = c.get(f"/v1/jobs/{jid}/plans/3").json()
        assert improved["metrics"]["period"] == 73
        assert improved["incarnations"] == [[1, 1], [2, 1]]

        # a suspect report about a worker that keeps heartbeating: re-published, stamped
        c.post(f"/v1/jobs/{jid}/heartbeats", json={"replica": 1, "stage": 0, "iteration": 0,
                                                  "incarnation": 2}).raise_for_status()
        c.post(f"/v1/jobs/{jid}/suspects", json={"replica": 1, "stage": 0}).raise_for_status()
        for _ in range(30):
            c.post(f"/v1/jobs/{jid}/heartbeats", json={"replica": 1, "stage": 0,
                                                      "iteration": 0, "incarnation": 2})
            r = c.get(f"/v1/jobs/{jid}/plan", params={"after": 3, "wait": 0.1})
            if r.status_code == 200:
                break
        assert r.status_code == 200 and r.json()["failed"] == [[0, 1]]
        assert c.get(f"/v1/jobs/{jid}").json()["plans"][-1]["cause"] == "resync"
        assert r.json()["incarnations"] == [[1, 1], [2, 1]]


@pytest.mark.hard_timeout(120)
def test_incarnations_survive_sigkill_and_restart(tmp_path):
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--heartbeat-timeout", "30").start()
    try:
        c = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, token = register(c, D=2, S=3, M=2)
        url = f"/v1/jobs/{jid}/events"
        first = c.post(url, json=recovery("rep", 1, 0, incarnation=3))
        assert first.status_code == 200
        c.post(url, json=failure("f", 0, 2)).raise_for_status()
        before = c.get(f"/v1/jobs/{jid}/plan")
        assert before.json()["incarnations"] == [[1, 1, 1], [3, 1, 1]]
        srv.kill()
        srv.start()
        after = c.get(f"/v1/jobs/{jid}/plan")
        assert after.content == before.content
        assert c.get(f"/v1/jobs/{jid}").json()["incarnations"] == [[1, 1, 1], [3, 1, 1]]
        w = client(srv.url, token)
        assert w.get(f"/v1/jobs/{jid}/workers/1/0/plan").json()["incarnation"] == 3
        # the membership is enforced as before the restart
        r = c.post(url, json=recovery("late", 1, 0, incarnation=3))
        assert r.status_code == 409 and "not newer than 3" in r.json()["detail"]
        assert beat(w, jid, 1, 0, incarnation=2).status_code == 409
        assert beat(w, jid, 1, 0, incarnation=3).status_code == 200
        replay = c.post(url, json=recovery("rep", 1, 0, incarnation=3))
        assert replay.status_code == 200 and replay.json() == first.json()
        # new versions start from the recovered grid
        r = c.post(url, json=recovery("back", 0, 2))
        assert r.status_code == 200 and r.json()["incarnation"] == 2
        plan = c.get(f"/v1/jobs/{jid}/plan").json()
        assert plan["version"] == 3 and plan["incarnations"] == [[1, 1, 2], [3, 1, 1]]
    finally:
        srv.stop()
