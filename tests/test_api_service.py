"""End-to-end tests of the plan service on a real uvicorn server on 127.0.0.1."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from api_support import ADMIN, ThreadServer, admin_headers, register_job, spec, token_client
from executor.sources.http_source import HttpPlanSource
from planner.validate import validate

pytestmark = pytest.mark.procs  # its fixtures or tests start processes

HB_TIMEOUT = 0.6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("api") / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=HB_TIMEOUT, precompute_failures=1,
                      max_body_bytes=64 * 1024) as s:
        yield s


register = register_job


def worker(server, token):
    return token_client(server.url, token)


def ev(event_id, kind, r, s):
    return {"event_id": event_id, "kind": kind, "replica": r, "stage": s}


def test_register_publishes_version_0(admin):
    jid, token = register(admin)
    assert token.startswith(jid + ".")
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["version"] == 0 and plan["failed"] == []
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["state"] == "running" and job["plan_version"] == 0
    assert job["plans"][0]["cause"] == "registered"


def test_events_idempotent_and_conflicts(admin):
    jid, _ = register(admin)
    url = f"/v1/jobs/{jid}/events"
    first = admin.post(url, json=ev("e1", "failure", 1, 2))
    assert first.status_code == 200, first.text
    assert first.json()["plan_version"] == 1 and first.json()["failed"] == [[1, 2]]
    again = admin.post(url, json=ev("e1", "failure", 1, 2))
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    other = admin.post(url, json=ev("e1", "failure", 0, 0))
    assert other.status_code == 409 and "different body" in other.json()["detail"]
    dup = admin.post(url, json=ev("e2", "failure", 1, 2))
    assert dup.status_code == 409 and "already failed" in dup.json()["detail"]
    stale = admin.post(url, json=ev("e3", "recovery", 0, 0))
    assert stale.status_code == 409 and "is live" in stale.json()["detail"]
    unknown = admin.post(url, json=ev("e4", "failure", 4, 0))
    assert unknown.status_code == 422 and "outside the 4x4 grid" in unknown.json()["detail"]
    bad = admin.post(url, json={"event_id": "e5", "kind": "explode", "replica": 0, "stage": 0})
    assert bad.status_code == 422 and "kind" in bad.json()["detail"]
    rec = admin.post(url, json=ev("e6", "recovery", 1, 2))
    assert rec.status_code == 200 and rec.json()["failed"] == [] and rec.json()["plan_version"] == 2
    # only the accepted events were recorded, and versions only grew
    assert [e["event_id"] for e in admin.get(url).json()] == ["e1", "e6"]
    versions = [p["version"] for p in admin.get(f"/v1/jobs/{jid}").json()["plans"]]
    assert versions == [0, 1, 2]
    plan = admin.get(f"/v1/jobs/{jid}/plans/1").json()
    assert plan["failed"] == [[1, 2]]
    assert admin.get(f"/v1/jobs/{jid}/plans/7").status_code == 404


def test_new_plan_is_valid_and_avoids_failed_worker(admin):
    from planner.plan import Plan
    jid, _ = register(admin)
    admin.post(f"/v1/jobs/{jid}/events", json=ev("x", "failure", 2, 1)).raise_for_status()
    plan = Plan.model_validate(admin.get(f"/v1/jobs/{jid}/plan").json())
    assert plan.worker(2, 1) is None and plan.failed == [(2, 1)]
    assert validate(plan) == []


def test_tokens(admin, server):
    jid, token = register(admin)
    other, other_token = register(admin)
    w = worker(server, token)
    hb = {"replica": 0, "stage": 0, "iteration": 0}
    assert httpx.post(f"{server.url}/v1/jobs/{jid}/heartbeats", json=hb).status_code == 401
    bad = worker(server, jid + ".forged")
    assert bad.post(f"/v1/jobs/{jid}/heartbeats", json=hb).status_code == 401
    assert bad.get(f"/v1/jobs/{jid}/plan").status_code == 401
    assert w.post(f"/v1/jobs/{jid}/heartbeats", json=hb).status_code == 200
    assert w.post(f"/v1/jobs/{other}/heartbeats", json=hb).status_code == 403
    assert w.get(f"/v1/jobs/{other}/plan").status_code == 403
    assert w.post("/v1/jobs", json=spec()).status_code == 403  # registering is admin only
    assert httpx.post(f"{server.url}/v1/jobs", json=spec()).status_code == 401
    # the check comes before the body is parsed
    assert httpx.post(f"{server.url}/v1/jobs/{jid}/events", content=b"{nope").status_code == 401
    assert admin.get("/v1/jobs/nosuchjob").status_code == 404
    assert w.get("/v1/jobs/nosuchjob/plan").status_code == 403


def test_body_size_limit(admin):
    jid, _ = register(admin)
    big = {"event_id": "big", "kind": "failure", "replica": 0, "stage": 0, "reason": "x" * 100}
    r = admin.post(f"/v1/jobs/{jid}/events", content=b" " * (70 * 1024) + httpx.Request(
        "POST", "/", json=big).content, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(80):
            yield b" " * 1024

    r = admin.post(f"/v1/jobs/{jid}/events", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert admin.get(f"/v1/jobs/{jid}/events").json() == []


def test_malformed_spec_is_422_with_reason(admin):
    bad = spec()
    bad["cost"]["F"] = [1, 2]
    r = admin.post("/v1/jobs", json=bad)
    assert r.status_code == 422 and "cost.F has 2 entries" in r.json()["detail"]
    r = admin.post("/v1/jobs", json=spec(D=512, S=64, M=64))
    assert r.status_code == 422 and "too large" in r.json()["detail"]


def test_long_poll_returns_promptly(admin, server):
    jid, token = register(admin)
    got = {}

    def poll():
        with worker(server, token) as w:
            r = w.get(f"/v1/jobs/{jid}/plan", params={"after": 0, "wait": 20})
            got["t"], got["r"] = time.perf_counter(), r

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # parked, not answered
    sent = time.perf_counter()
    admin.post(f"/v1/jobs/{jid}/events", json=ev("f", "failure", 3, 3)).raise_for_status()
    t.join(5)
    assert got["r"].status_code == 200 and got["r"].json()["version"] == 1
    assert got["t"] - sent < 0.5
    t0 = time.perf_counter()
    r = admin.get(f"/v1/jobs/{jid}/plan", params={"after": 1, "wait": 0.3})
    assert r.status_code == 204 and 0.25 < time.perf_counter() - t0 < 2


def test_worker_scoped_plan(admin, server):
    jid, token = register(admin)
    w = worker(server, token)
    admin.post(f"/v1/jobs/{jid}/events", json=ev("f", "failure", 0, 1)).raise_for_status()
    live = w.get(f"/v1/jobs/{jid}/workers/1/1/plan").json()
    full = w.get(f"/v1/jobs/{jid}/plan").json()
    mine = next(x for x in full["workers"] if (x["replica"], x["stage"]) == (1, 1))
    assert live["in_plan"] and live["version"] == 1 and live["actions"] == mine["actions"]
    # the route rows of the micro-batches it runs (all it needs), as in the whole plan
    assert {int(g) for g in live["routes"]} == {a["microbatch"] for a in mine["actions"]
                                                if a["microbatch"] is not None}
    assert all(full["routes"][int(g)] == row for g, row in live["routes"].items())
    dead = w.get(f"/v1/jobs/{jid}/workers/0/1/plan").json()
    assert dead["in_plan"] is False and dead["actions"] == []
    assert w.get(f"/v1/jobs/{jid}/workers/9/1/plan").status_code == 422
    assert w.get(f"/v1/jobs/{jid}/workers/1/1/plan?after=1&wait=0.1").status_code == 204


def test_fast_path_answers_like_the_routes(admin, server):
    """A plain plan GET is answered by api/fastpath.py, one with an extra parameter by the
    FastAPI route: same status, bytes and headers; bad input still gets the routes' errors."""
    jid, token = register(admin)
    w = worker(server, token)
    for path in (f"/v1/jobs/{jid}/plan", f"/v1/jobs/{jid}/workers/2/1/plan"):
        for q in ("", "?after=-1&wait=1", "?after=0&wait=0.05"):
            fast = w.get(path + q)
            slow = w.get(path + (q + "&" if q else "?") + "x=1")
            assert fast.status_code == slow.status_code, (path, q)
            assert fast.content == slow.content
            for h in ("content-type", "etag", "cache-control", "content-length"):
                assert fast.headers.get(h) == slow.headers.get(h), h
    assert w.get(f"/v1/jobs/{jid}/plan?after=0.5").status_code == 422
    assert w.get(f"/v1/jobs/{jid}/plan?wait=4000").status_code == 422
    assert worker(server, "nope.x").get(f"/v1/jobs/{jid}/plan").status_code == 401


def test_heartbeat_timeout_declares_failure(admin, server):
    jid, token = register(admin)
    src = HttpPlanSource(server.url, jid, token)
    src.heartbeat(0, 0, 1)
    src.heartbeat(1, 0, 1)
    t0 = time.perf_counter()
    deadline = t0 + 5
    while time.perf_counter() < deadline:  # keep (1, 0) alive, let (0, 0) go silent
        src.heartbeat(1, 0, 2)
        plan = src.wait_for_plan(0, 0.1)
        if plan is not None:
            break
    assert plan is not None and plan.version == 1 and plan.failed == [(0, 0)]
    assert HB_TIMEOUT * 0.9 < time.perf_counter() - t0 < HB_TIMEOUT + 1.5
    events = admin.get(f"/v1/jobs/{jid}/events").json()
    assert [(e["source"], e["replica"], e["stage"]) for e in events] == [("heartbeat", 0, 0)]
    # the fenced worker's heartbeat is refused, and it is not in the plan
    r = worker(server, token).post(f"/v1/jobs/{jid}/heartbeats",
                                   json={"replica": 0, "stage": 0, "iteration": 3})
    assert r.status_code == 409
    assert "recycle_heartbeats_missed_total" in httpx.get(server.url + "/metrics").text
    src.close()


def test_suspect_speeds_detection(admin, server):
    jid, token = register(admin)
    w = worker(server, token)
    w.post(f"/v1/jobs/{jid}/heartbeats", json={"replica": 2, "stage": 3, "iteration": 0})
    time.sleep(HB_TIMEOUT / 4 + 0.05)  # silent longer than the suspect grace
    t0 = time.perf_counter()
    r = w.post(f"/v1/jobs/{jid}/suspects",
               json={"replica": 2, "stage": 3, "reporter": {"replica": 2, "stage": 2}})
    assert r.status_code == 200
    r = w.get(f"/v1/jobs/{jid}/plan", params={"after": 0, "wait": 5})
    assert r.json()["failed"] == [[2, 3]]
    assert time.perf_counter() - t0 < HB_TIMEOUT / 2


def test_suspect_of_a_live_worker_republishes_the_same_failed_set(admin, server):
    # Regression: workers that aborted an iteration on a comm timeout wait for a newer
    # plan; when the suspected worker is alive, none came and they waited forever.
    jid, token = register(admin)
    w = worker(server, token)
    stop = threading.Event()

    def alive():
        while not stop.is_set():
            w.post(f"/v1/jobs/{jid}/heartbeats", json={"replica": 1, "stage": 1, "iteration": 0})
            time.sleep(HB_TIMEOUT / 10)
    beater = threading.Thread(target=alive)
    beater.start()
    try:
        time.sleep(HB_TIMEOUT / 5)
        r = w.post(f"/v1/jobs/{jid}/suspects",
                   json={"replica": 1, "stage": 1, "reporter": {"replica": 1, "stage": 0}})
        assert r.status_code == 200 and r.json()["declared_failed"] is False
        r = w.get(f"/v1/jobs/{jid}/plan", params={"after": 0, "wait": 5})
        assert r.status_code == 200
        assert r.json()["version"] == 1 and r.json()["failed"] == []
    finally:
        stop.set()
        beater.join()


def test_a_cut_link_reported_from_both_ends_fences_one_end(admin, server):
    """Both ends of a cut link heartbeat and report each other with LINK_DOWN (the words a
    worker's failed rendezvous probe writes, member_links.py): the service fenced nobody
    (every heartbeat arrived) and re-published the same members for ever. Now one end is
    declared failed once both said so; one end alone (a probe lost to packet loss) fences
    nobody."""
    jid, token = register(admin)
    w = worker(server, token)
    stop = threading.Event()

    def alive():
        while not stop.is_set():
            for slot in ((0, 1), (0, 2), (1, 1)):
                w.post(f"/v1/jobs/{jid}/heartbeats",
                       json={"replica": slot[0], "stage": slot[1], "iteration": 0})
            time.sleep(HB_TIMEOUT / 10)
    beater = threading.Thread(target=alive)
    beater.start()

    def cut(frm, to):
        return w.post(f"/v1/jobs/{jid}/suspects", json={
            "replica": to[0], "stage": to[1], "reporter": {"replica": frm[0], "stage": frm[1]},
            "reason": f"world v1 rendezvous: link down to [({to[0]}, {to[1]})] (no TCP "
                      "connection to their address)"})
    try:
        time.sleep(HB_TIMEOUT / 5)
        assert cut((1, 1), (0, 1)).json()["declared_failed"] is False  # one end only
        time.sleep(1.5)  # past the gathering time: still nobody failed
        assert admin.get(f"/v1/jobs/{jid}").json()["failed"] == []
        assert cut((0, 1), (0, 2)).status_code == 200
        assert cut((0, 2), (0, 1)).status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not admin.get(f"/v1/jobs/{jid}").json()["failed"]:
            time.sleep(0.05)
        assert admin.get(f"/v1/jobs/{jid}").json()["failed"] in ([[0, 1]], [[0, 2]])
        events = admin.get(f"/v1/jobs/{jid}/events").json()
        assert [e["source"] for e in events] == ["cut"], events
    finally:
        stop.set()
        beater.join()


def test_http_plan_source(admin, server):
    jid, token = register(admin)
    with HttpPlanSource(server.url, jid, token, reporter=(0, 0)) as src:
        assert src.wait_for_plan(-1, 1).version == 0
        assert src.wait_for_plan(0, 0.2) is None
        threading.Timer(0.2, lambda: admin.post(
            f"/v1/jobs/{jid}/events", json=ev("t", "failure", 1, 1))).start()
        assert src.wait_for_plan(0, 5).version == 1
        src.report_suspect(3, 3, "timeout on recv")
    with HttpPlanSource(server.url, jid, "wrong") as bad, pytest.raises(PermissionError):
        bad.wait_for_plan(0, 1)
    with HttpPlanSource("http://127.0.0.1:9", jid, token) as dead:
        t0 = time.perf_counter()
        assert dead.wait_for_plan(0, 0.3) is None  # unreachable: retried, then None
        assert time.perf_counter() - t0 < 2


def test_admin_token_required_for_list_and_metrics_open(server):
    assert httpx.get(server.url + "/v1/jobs").status_code == 401
    assert httpx.get(server.url + "/v1/jobs", headers=admin_headers()).status_code == 200
    assert httpx.get(server.url + "/healthz").json()["status"] == "ok"
    text = httpx.get(server.url + "/metrics").text
    for name in ("recycle_plan_version", "recycle_solve_seconds", "recycle_plan_cache_hits_total",
                 "recycle_plan_cache_misses_total", "recycle_heartbeats_missed_total"):
        assert name in text
    assert httpx.get(server.url + "/docs").status_code == 200
    assert ADMIN not in text


def test_service_watch_and_worker_source(admin, server):
    """`recycle train --service`: the coordinator follows the service's plans; a worker
    reports suspects and rejoins over HTTP, and ends when the coordinator's store says so."""
    from executor.runtime.transport.endpoints import connect_store
    from executor.sources.service_source import ServiceWatch, ServiceWorkerSource
    jid, token = register(admin, D=2, S=2, M=2)
    watch = ServiceWatch(server.url, jid, token, timeout_s=5)
    store = connect_store("127.0.0.1", 0, timeout_s=5, is_master=True)
    store.set("config", "{}")
    config = {**watch.worker_config(), "token": token}  # workers get the token separately
    src = ServiceWorkerSource(store, (1, 1), 2, config, "run1", slice_s=0.1)
    assert src.wait_for_plan(-1, 1).version == 0
    admin.post(f"/v1/jobs/{jid}/events", json={"event_id": "f", "kind": "failure",
                                              "replica": 1, "stage": 1}).raise_for_status()
    assert src.wait_for_plan(0, 5).failed == [(1, 1)]
    src.rejoin(1)
    src.rejoin(1)  # idempotent
    assert src.wait_for_plan(1, 5).failed == []
    t0 = time.monotonic()
    while watch.plan.version < 2 and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    assert watch.plan.version == 2
    events = admin.get(f"/v1/jobs/{jid}/events").json()
    assert [(e["kind"], e["source"]) for e in events] == [("failure", "operator"),
                                                          ("recovery", "worker")]
    src.heartbeat(1, 1, 0)
    store.set("finished", "1")
    last = src.wait_for_plan(2, 5)
    assert last.version == 3 and last.workers == []
    watch.close()
    src.http.close()


def local_port(r: httpx.Response) -> int:
    """The client's port of the connection `r` came on: equal ports, same connection."""
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def test_out_of_range_integers_answer_422_on_a_live_connection(admin):
    # Regression: a cost of 10**30 answered 500 (SQLite integer overflow in the plan cache)
    # and the server then dropped the client's keep-alive connection.
    def bad(edit):
        s = spec()
        edit(s)
        return s

    cases = [
        (bad(lambda s: s["cost"]["F"].__setitem__(0, 10**30)), "cost.F.0"),
        (bad(lambda s: s["cost"]["OPT"].__setitem__(3, 2**63)), "cost.OPT.3"),
        (bad(lambda s: s["cost"]["W"].__setitem__(1, -1)), "cost.W.1"),
        (bad(lambda s: s["p2p"].__setitem__("cross", 10**13)), "p2p.cross"),
        (bad(lambda s: s["memory"].__setitem__("capacity", [10**20] * 4)), "memory.capacity"),
        (bad(lambda s: s.__setitem__("microbatches", 10**7)), "microbatches"),
        (bad(lambda s: s.__setitem__("replicas", 10**400)), "replicas"),
        # each number in range, but a plan could last longer than 2**53
        (dict(spec(D=4, S=4, M=28, F=10**12, I=10**12, W=10**12, OPT=10**12),
              microbatches=64), "too long"),
        # durations divided by a tiny speed
        (bad(lambda s: s.__setitem__("speed", [[1e-300] * 4] + [[1.0] * 4] * 3)), "too long"),
    ]
    port = local_port(admin.get("/healthz"))
    for body, where in cases:
        r = admin.post("/v1/jobs", json=body)
        assert r.status_code == 422, (where, r.status_code, r.text)
        detail = r.json()["detail"]
        assert where in detail and "\n" not in detail, detail
        ok = admin.get("/healthz")
        assert ok.status_code == 200 and local_port(ok) == port, where


def test_a_spec_at_the_limits_registers_and_plans_fit(admin, server):
    """The largest durations that pass validation give plans that SQLite and JSON hold."""
    big = 10**12
    body = spec(D=4, S=4, M=28, F=big, I=big, W=big, OPT=big, intra=big, cross=big,
                activation=10**15, capacity=10**15)
    r = admin.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    r = admin.post(f"/v1/jobs/{jid}/events", json=ev("f", "failure", 1, 2))
    assert r.status_code == 200, r.text
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["version"] == 1 and 0 < plan["metrics"]["period"] <= 2**53
    assert max(a["end"] for w in plan["workers"] for a in w["actions"]) <= 2**53


def test_unexpected_error_answers_json_500_and_keeps_the_connection(admin, server):
    """A bug in a handler (here a route that raises, and a job whose stored plan bytes are
    broken, which the plan fast path trips on) must answer a one-line JSON 500, and the
    client's connection must serve the next request."""
    async def boom():
        raise RuntimeError("a bug\nover two lines")

    if not any(getattr(r, "path", None) == "/test-boom" for r in server.app.router.routes):
        server.app.add_api_route("/test-boom", boom)
    port = local_port(admin.get("/healthz"))
    r = admin.get("/test-boom")
    assert r.status_code == 500 and r.json() == {"detail": "internal error; see the service log"}
    ok = admin.get("/healthz")
    assert ok.status_code == 200 and local_port(ok) == port

    jid, _ = register(admin, D=2, S=2, M=2)
    job = server.service.jobs[jid]
    job.plan, job.views = job.plan.model_copy(update={"workers": None}), {}  # shares fail
    r = admin.get(f"/v1/jobs/{jid}/workers/0/0/plan")  # the fast path
    assert r.status_code == 500 and r.json() == {"detail": "internal error; see the service log"}
    ok = admin.get("/healthz")
    assert ok.status_code == 200 and local_port(ok) == port


def test_greedy_check_of_a_renumbering_publishes_after_the_answer(tmp_path):
    """An event served from the cache answers with the mapped plan at once; the check of
    that plan against greedy of the job's own numbering runs after the answer (in a child
    process) and, greedy being better, publishes it as the next version."""
    from planner.solvers.backends import solve
    from planner.solvers.greedy import greedy_plan
    with ThreadServer(tmp_path / "s.db", precompute_failures=0) as srv:
        admin = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, _ = register(admin, D=3, S=3, M=4)
        job = srv.service.jobs[jid].spec
        # a valid but poorly routed plan for the canonical case: replica 0's micro-batches
        # all go to replica 1 at stage 1
        routes = [list(r) for r in solve(job, [(0, 1)], "greedy").routes]
        for g in range(job.microbatches):
            routes[g][1] = 1
        poor = greedy_plan(job, [(0, 1)], routes=routes)
        best = solve(job, [(2, 1)], "greedy")
        assert best.metrics.period < poor.metrics.period
        assert srv.service.cache.put(poor)
        r = admin.post(f"/v1/jobs/{jid}/events", json=ev("f", "failure", 2, 1))
        assert r.status_code == 200 and r.json()["plan_source"] == "cache", r.text
        first = admin.get(f"/v1/jobs/{jid}/plans/1").json()
        assert first["metrics"]["period"] == poor.metrics.period  # served at once, mapped
        got = admin.get(f"/v1/jobs/{jid}/plan", params={"after": 1, "wait": 20})
        assert got.status_code == 200
        plan = got.json()
        assert plan["version"] == 2 and plan["failed"] == [[2, 1]]
        assert plan["metrics"]["period"] == best.metrics.period
        causes = [p["cause"] for p in admin.get(f"/v1/jobs/{jid}").json()["plans"]]
        assert causes[-1] == "greedy:renumbered"
        # another numbering of the same case, now cached with greedy's plan: the check in
        # the child finds greedy no better, and publishes nothing more
        assert admin.post(f"/v1/jobs/{jid}/events",
                          json=ev("r", "recovery", 2, 1)).json()["plan_version"] == 3
        r = admin.post(f"/v1/jobs/{jid}/events", json=ev("f1", "failure", 1, 1)).json()
        assert r["plan_version"] == 4 and r["plan_source"] == "cache"
        assert admin.get(f"/v1/jobs/{jid}/plan", params={"after": 4, "wait": 3}
                         ).status_code == 204
        admin.close()
