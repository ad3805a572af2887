"""A job whose live workers cannot serve every stage: with snapshots (the service's default,
as runs keep them by default) a stage lost whole moves a worker in from peer memory and too
few workers pause the job; without them it halts. A real uvicorn server on 127.0.0.1."""
from __future__ import annotations

import httpx
import pytest

from api_support import ThreadServer, admin_headers, register_job, token_client
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
    """One live worker of a 2x2 job: no version while paused (long-polls wait, heartbeats
    and events are taken, deaths still count); a return publishes the next version."""
    jid, token = register(admin, D=2, S=2, M=2)
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


def test_halt_when_a_stage_loses_every_replica_without_snapshots(tmp_path):
    with ThreadServer(tmp_path / "service.db", heartbeat_timeout_s=HB_TIMEOUT,
                      precompute_failures=1, elastic_snapshots=False) as server, \
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
