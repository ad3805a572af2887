"""A job whose live workers cannot serve every stage: with snapshots (the service's default,
as runs keep them by default) a stage lost whole moves a worker in from peer memory and too
few workers pause the job; without them it halts. A real uvicorn server on 127.0.0.1."""
from __future__ import annotations

import httpx
import pytest

from api_support import ThreadServer, admin_headers, register_job, spec, token_client
from executor.sources.http_source import HttpPlanSource
from executor.sources.plan_source import TrainingHalted

pytestmark = pytest.mark.procs  # its server starts solver processes

HB_TIMEOUT = 0.6
register = register_job


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("api") / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=HB_TIMEOUT, precompute_failures=1) as s:
        yield s


def worker(server, token):
    return token_client(server.url, token)


def ev(event_id, kind, r, s):
    return {"event_id": event_id, "kind": kind, "replica": r, "stage": s}


def test_a_stage_lost_whole_moves_a_worker_from_peer_memory_by_default(admin):
    jid, token = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/events"
    assert admin.post(url, json=ev("a", "failure", 0, 1)).json()["state"] == "running"
    r = admin.post(url, json=ev("b", "failure", 1, 1)).json()
    assert r["state"] == "running" and r["plan_version"] == 2, r
    moves = admin.get(f"/v1/jobs/{jid}/plan").json()["moves"]
    assert [(m["to_stage"], m["source"]) for m in moves] == [(1, "snapshot")], moves


def test_too_few_live_workers_pause_the_job_and_a_return_resumes_it(admin, server):
    """One live worker of a 2x2 job registered with a fixed shape: no version while paused
    (long-polls wait, heartbeats and events are taken, deaths still count); a return
    publishes the next version."""
    jid, token = register(admin, shape="fixed", D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/events"
    for i, w in enumerate([(0, 1), (1, 1)]):
        admin.post(url, json=ev(f"k{i}", "failure", *w)).raise_for_status()
    r = admin.post(url, json=ev("k2", "failure", 0, 0)).json()
    assert r["state"] == "paused" and "1 live worker cannot serve 2 stages" in r["reason"], r
    assert r["plan_version"] == 2 and r["failed"] == [[0, 0], [0, 1], [1, 1]]
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["state"] == "paused" and job["plan_version"] == 2
    assert admin.get(f"/v1/jobs/{jid}/plan?after=2&wait=0.3").status_code == 204
    hb = worker(server, token).post(f"/v1/jobs/{jid}/heartbeats",
                                    json={"replica": 1, "stage": 0, "iteration": 3})
    assert hb.status_code == 200, hb.text
    back = admin.post(url, json=ev("b", "recovery", 0, 1)).json()
    assert back["state"] == "running" and back["plan_version"] == 3, back
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["version"] == 3 and {r["worker"] for r in plan["roles"]} == {"1.0", "0.1"}


def test_too_few_live_workers_cut_the_pipeline_by_default_and_returns_restore_it(admin):
    """One live worker of a 2x2 job at the default shape (auto): the service publishes a
    plan of one stage (both of the job's stages merged) for it instead of pausing; when a
    worker comes back the job's own two stages return, spelled out as a partition."""
    jid, token = register(admin, D=2, S=2, M=2)
    assert admin.get(f"/v1/jobs/{jid}").json()["shape"] == "auto"
    url = f"/v1/jobs/{jid}/events"
    for i, w in enumerate([(0, 1), (1, 1)]):
        admin.post(url, json=ev(f"k{i}", "failure", *w)).raise_for_status()
    r = admin.post(url, json=ev("k2", "failure", 0, 0)).json()
    assert r["state"] == "running" and r["plan_version"] == 3, r
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["partition"]["bounds"] == [0, 2] and plan["partition"]["unit"] == "stage"
    assert plan["job"]["stages"] == 1 and [x["worker"] for x in plan["roles"]] == ["1.0"]
    assert admin.get(f"/v1/jobs/{jid}").json()["speeds"] == [[1.0, 1.0], [1.0, 1.0]]
    back = admin.post(url, json=ev("b", "recovery", 0, 1)).json()
    assert back["state"] == "running" and back["plan_version"] == 4, back
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    assert plan["job"]["stages"] == 2 and plan["partition"]["bounds"] == [0, 1, 2], plan
    assert {x["worker"] for x in plan["roles"]} == {"1.0", "0.1"}


def test_a_shape_is_one_of_auto_or_fixed(admin):
    r = admin.post("/v1/jobs", json=spec(D=2, S=2, M=2), params={"shape": "round"})
    assert r.status_code == 422 and "auto" in r.text, r.text


def test_halt_when_a_stage_loses_every_replica_without_snapshots(tmp_path):
    with ThreadServer(tmp_path / "service.db", heartbeat_timeout_s=HB_TIMEOUT,
                      precompute_failures=1, elastic_snapshots=False,
                      elastic_disk=False) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        _halts(admin, server)


def _halts(admin, server):
    jid, token = register(admin, D=2, S=2, M=2)
    url = f"/v1/jobs/{jid}/events"
    assert admin.post(url, json=ev("a", "failure", 0, 1)).json()["state"] == "running"
    r = admin.post(url, json=ev("b", "failure", 1, 1))
    assert r.status_code == 200
    assert r.json()["state"] == "halted" and "restore from checkpoint" in r.json()["reason"]
    for path in ("/plan", "/plan?after=0&wait=5", "/workers/0/0/plan"):
        p = admin.get(f"/v1/jobs/{jid}{path}")
        assert p.status_code == 410 and "restore from checkpoint" in p.json()["detail"], path
    later = admin.post(url, json=ev("c", "recovery", 1, 1))
    assert later.status_code == 409 and "halted" in later.json()["detail"]
    assert admin.post(url, json=ev("b", "failure", 1, 1)).json()["state"] == "halted"
    hb = worker(server, token).post(f"/v1/jobs/{jid}/heartbeats",
                                    json={"replica": 0, "stage": 0, "iteration": 1})
    assert hb.status_code == 410
    with HttpPlanSource(server.url, jid, token) as src, pytest.raises(TrainingHalted):
        src.wait_for_plan(0, 1.0)
    assert admin.get(f"/v1/jobs/{jid}/plans/1").status_code == 200  # history stays


def test_a_cut_pipeline_survives_a_service_restart(tmp_path):
    """The shape in force is the latest plan's: a restarted service goes on from it (the
    next event is planned from the cut shape, not the job's own) and keeps the job's
    registered shape setting; where no shape fits the live workers, the job pauses."""
    db = tmp_path / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=30, precompute_failures=1) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        jid, _ = register(admin, D=2, S=3, M=2)
        fixed, _ = register(admin, shape="fixed", D=2, S=2, M=2)
        url = f"/v1/jobs/{jid}/events"
        for i, w in enumerate([(0, 0), (1, 0), (0, 1), (1, 2)]):
            admin.post(url, json=ev(f"k{i}", "failure", *w)).raise_for_status()
        cut = admin.get(f"/v1/jobs/{jid}/plan").json()
        assert cut["job"]["stages"] < 3 and len(cut["roles"]) == 2, cut
    with ThreadServer(db, heartbeat_timeout_s=30, precompute_failures=1) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        job = admin.get(f"/v1/jobs/{jid}").json()
        assert job["shape"] == "auto" and job["plan_version"] == cut["version"], job
        assert admin.get(f"/v1/jobs/{fixed}").json()["shape"] == "fixed"
        members = server.service.jobs[jid].members
        assert members.partition is not None and members.shape_job.stages == cut["job"]["stages"]
        back = admin.post(url, json=ev("b", "recovery", 0, 0)).json()
        assert back["state"] == "running", back["reason"]
        own = admin.get(f"/v1/jobs/{jid}/plan").json()
        # planned from the loaded shape: the three live workers all train (the chooser
        # weighs the job's own three stages against staying at two)
        assert len(own["roles"]) == 3 and own["partition"] is not None, own
        # one live again: a 3-stage job's units (its stages) merge two at most
        for i, w in enumerate([(0, 0), (0, 2)]):
            admin.post(url, json=ev(f"j{i}", "failure", *w)).raise_for_status()
        r = admin.get(f"/v1/jobs/{jid}").json()
        assert r["state"] == "paused" and "fit no shape" in r["reason"], r


@pytest.mark.parametrize("M", [3, 4])
def test_events_after_a_cut_leave_the_straggler_detector_of_the_job_grid_alone(admin, M):
    """A shape's slots are of its own grid (here up to D*M replicas of one stage): the
    detector's grid is the job's. An event that changed who fills a shape's slot once
    raised IndexError there after the event was stored, and the job never published
    again (a chaos run through the service hung on it)."""
    jid, _ = register(admin, D=2, S=2, M=M)
    url = f"/v1/jobs/{jid}/events"
    for i, w in enumerate([(1, 1), (0, 1), (1, 0)]):
        assert admin.post(url, json=ev(f"k{i}", "failure", *w)).status_code == 200
    assert admin.get(f"/v1/jobs/{jid}/plan").json()["job"]["stages"] == 1
    for i, w in enumerate([(1, 0), (1, 1)]):
        r = admin.post(url, json=ev(f"r{i}", "recovery", *w))
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
    r = admin.post(url, json=ev("k9", "failure", 0, 0))
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert admin.get(f"/v1/jobs/{jid}").json()["plan_version"] == r.json()["plan_version"]


def test_a_run_that_cannot_change_shape_refuses_a_job_that_may(admin, server, tmp_path):
    """A job registered with shape=auto may be cut; a run with --shape fixed (or a model
    that builds its stages by count) could not carry that out: it refuses at the start,
    in one line, before any worker starts. A fixed job takes either run."""
    from executor.inputs.launch_spec import LaunchSpec
    from executor.launch.launcher import Coordinator
    from executor.sources.service_source import ServiceWatch
    from test_e2e_service import CFG

    for shape, ok in (("auto", False), ("fixed", True)):
        jid, token = register(admin, shape=shape, D=2, S=2, M=2)
        watch = ServiceWatch(server.url, jid, token, timeout_s=10)
        try:
            assert watch.shape == shape
            spec = LaunchSpec(CFG, watch.plan.job, 2, run_dir=str(tmp_path / shape),
                              shape="fixed")
            if ok:
                continue
            with pytest.raises(ValueError) as e:
                Coordinator(spec, service=watch)
            msg = str(e.value)
            assert "registered with shape=auto" in msg and "--shape fixed" in msg, msg
            assert "\n" not in msg
        finally:
            watch.close()


# ---- issue 42 item 3: a paused job stays paused through deaths and returns -----------------
def _events(admin, jid, steps):
    out = []
    for i, (kind, r, s) in enumerate(steps):
        res = admin.post(f"/v1/jobs/{jid}/events", json=ev(f"{kind[0]}{i}-{r}{s}", kind, r, s))
        assert res.status_code == 200, res.text
        out.append(res.json())
    return out


def test_a_worker_back_during_a_pause_holds_nothing_when_every_live_worker_entered(admin,
                                                                                  server):
    """2x3, fixed shape: paused with one live worker; 0:2 comes back (its old process had
    entered the version in force, so once 0:0 says it entered it too every live worker
    has): the membership forgot that 0:2's new process holds nothing and planned it as
    the holder of stage 2."""
    jid, token = register(admin, shape="fixed", D=2, S=3, M=2)
    hb = worker(server, token)
    got = _events(admin, jid, [("failure", 1, 0), ("failure", 1, 1), ("failure", 1, 2)])
    v = got[-1]["plan_version"]
    for s in range(3):
        assert hb.post(f"/v1/jobs/{jid}/heartbeats", json={
            "replica": 0, "stage": s, "iteration": 2, "entered_version": v}).status_code == 200
    got = _events(admin, jid, [("failure", 0, 2), ("failure", 0, 1), ("recovery", 0, 2)])
    assert [r["state"] for r in got] == ["paused"] * 3, got
    assert hb.post(f"/v1/jobs/{jid}/heartbeats", json={
        "replica": 0, "stage": 0, "iteration": 2, "entered_version": v}).status_code == 200
    (back,) = _events(admin, jid, [("recovery", 1, 1)])
    assert back["state"] == "running", back
    plan = admin.get(f"/v1/jobs/{jid}/plan").json()
    joins = {m["worker"] for m in plan["moves"] if m["from_stage"] is None}
    assert joins == {"0.2", "1.1"}, plan["moves"]


def test_a_paused_job_restarted_with_a_worker_back_resumes_when_enough_are_back(tmp_path):
    """The issue's run through the service: paused with 1:0 back (no version admits it,
    it fills no slot of the plan in force); the service restarts; 0:2's return makes three
    live workers. The restarted service had forgotten 1:0 and halted ("2 live workers
    cannot serve 3 stages")."""
    db = tmp_path / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=30, precompute_failures=0) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        jid, _ = register(admin, shape="fixed", D=2, S=3, M=2)
        got = _events(admin, jid, [
            ("failure", 1, 0), ("failure", 0, 1), ("failure", 1, 2), ("recovery", 1, 0),
            ("failure", 1, 1), ("recovery", 1, 2), ("failure", 1, 0),
            ("failure", 0, 2), ("failure", 1, 2), ("recovery", 1, 0)])
        assert [r["state"] for r in got[-3:]] == ["paused"] * 3, got[-3:]
        assert got[-1]["reason"] == "2 live workers cannot serve 3 stages"
    with ThreadServer(db, heartbeat_timeout_s=30, precompute_failures=0) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        assert server.service.jobs[jid].members.back == {(1, 0)}
        (back,) = _events(admin, jid, [("recovery", 0, 2)])
        assert back["state"] == "running", back
        plan = admin.get(f"/v1/jobs/{jid}/plan").json()
        assert {r["stage"] for r in plan["roles"]} == {0, 1, 2}
        joins = {m["worker"] for m in plan["moves"] if m["from_stage"] is None}
        assert joins == {"1.0", "0.2"}, plan["moves"]
