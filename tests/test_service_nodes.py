"""Node events and roles at the plan service (docs/api.md, "Node events" and "Roles"), on
real servers on 127.0.0.1: a node removed is one version; a stage left short takes a worker
from another stage (the plan's roles and moves), and everything that names a worker or a
slot keeps the two apart; a node added takes dead workers' ids, which then join; a
restarted service rebuilds the same membership."""
from __future__ import annotations

import time

import httpx
import pytest

from api_support import ThreadServer, admin_headers, register_job, token_client
from planner.control.roles import failed_of
from planner.plan import Plan, home_of
from planner.validate import validate

pytestmark = pytest.mark.procs  # its fixtures or tests start processes

HB_TIMEOUT = 30.0  # nothing times out by itself here; grace 7.5 s


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("nodes") / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=HB_TIMEOUT, precompute_failures=1) as s:
        yield s


def remove(event_id, *workers, **kw):
    return {"event_id": event_id, "kind": "remove",
            "workers": [{"replica": r, "stage": s} for r, s in workers], **kw}


def add(event_id, **kw):
    return {"event_id": event_id, "kind": "add", **kw}


def beat(c, jid, r, s, **kw):
    return c.post(f"/v1/jobs/{jid}/heartbeats",
                  json={"replica": r, "stage": s, "iteration": 1, **kw})


def test_a_node_removed_fails_its_workers_in_one_version(admin, server):
    jid, token = register_job(admin, D=3, S=3, M=6)
    w = token_client(server.url, token)
    url = f"/v1/jobs/{jid}/nodes"
    r = w.post(url, json=remove("preempt-1", (0, 0), (0, 1), reason="spot notice"))
    assert r.status_code == 200, r.text
    a = r.json()
    assert (a["kind"], a["replica"], a["stage"], a["source"]) == ("remove", None, None, "worker")
    assert a["failed"] == [[0, 0], [0, 1]] and a["plan_version"] == 1
    assert a["workers"] == [{"replica": 0, "stage": 0, "incarnation": 1},
                            {"replica": 0, "stage": 1, "incarnation": 1}]
    raw = w.get(f"/v1/jobs/{jid}/plan").text
    assert '"roles"' not in raw and '"moves"' not in raw  # nobody moved: no roles
    assert Plan.model_validate_json(raw).failed == [(0, 0), (0, 1)]
    # idempotent by event_id; another body under it, or the same workers again: 409
    again = w.post(url, json=remove("preempt-1", (0, 0), (0, 1), reason="spot notice"))
    assert again.json() == a and again.headers["Idempotent-Replayed"] == "true"
    assert w.post(url, json=remove("preempt-1", (0, 0))).status_code == 409
    r = w.post(url, json=remove("preempt-2", (0, 1), (0, 0)))
    assert r.status_code == 409 and "nothing to remove" in r.json()["detail"]
    assert beat(w, jid, 0, 0).status_code == 409  # fenced, as after a failure event
    events = admin.get(f"/v1/jobs/{jid}/events").json()
    assert [(e["kind"], e["event_id"]) for e in events] == [("remove", "preempt-1")]
    assert events[0]["workers"] == a["workers"]
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["failed"] == [[0, 0], [0, 1]] and all("moves" not in p for p in job["plans"])
    view = admin.get(f"/v1/page/jobs/{jid}/view").json()
    assert view["roles"] is None and view["states"][0][:2] == ["failed", "failed"]
    assert view["events"][-1]["workers"] == [[0, 0], [0, 1]]


@pytest.mark.parametrize("body,msg", [
    ({"kind": "remove"}, "a node remove names its workers"),
    ({"kind": "remove", "workers": [{"replica": 0, "stage": 0}], "count": 1},
     "takes workers, not count"),
    ({"kind": "add", "workers": [{"replica": 0, "stage": 0}]}, "not workers"),
    ({"kind": "add"}, "how many workers"),
    ({"kind": "remove", "workers": [{"replica": 0, "stage": 5}]}, "outside the 2x2 grid"),
    ({"kind": "add", "count": 0}, "count: Input should be greater than or equal to 1"),
    ({"kind": "remove", "workers": []}, "workers: List should have at least 1 item"),
])
def test_bad_node_events_are_one_line_422(admin, body, msg):
    jid, _ = register_job(admin, D=2, S=2, M=2)
    r = admin.post(f"/v1/jobs/{jid}/nodes", json={"event_id": "bad", **body})
    assert r.status_code == 422 and msg in r.json()["detail"], r.text
    assert "\n" not in r.json()["detail"]
    assert admin.get(f"/v1/jobs/{jid}/events").json() == []


def test_a_stage_left_short_takes_a_worker_and_slots_and_workers_stay_apart(admin, server):
    jid, token = register_job(admin, D=3, S=3, M=6)
    w = token_client(server.url, token)
    dead = [(0, 1), (0, 2), (1, 2)]
    for r, s in dead:  # every worker heartbeats (armed), the dead ones too before they go
        assert beat(w, jid, r, s).status_code == 200
    a = admin.post(f"/v1/jobs/{jid}/nodes", json=remove("gone", *dead)).json()
    assert a["plan_version"] == 1 and a["failed"] == [list(x) for x in dead]
    plan = Plan.model_validate_json(w.get(f"/v1/jobs/{jid}/plan").text)
    assert validate(plan) == []
    [move] = plan.moves
    assert (move.from_stage, move.to_stage, move.source) == (0, 2, "peer")
    assert plan.failed == failed_of(plan.roles, 3, 3) and len(plan.failed) == 3
    mover, slot = home_of(move.worker), plan.slot_of(move.worker)
    assert slot[1] == 2 and mover[1] == 0
    # the job names dead workers; the plan, the empty slots it was made for
    job = admin.get(f"/v1/jobs/{jid}").json()
    assert job["failed"] == [list(x) for x in dead]
    assert job["plans"][-1]["moves"] == [move.model_dump(mode="json")]
    assert "moves" not in job["plans"][0]
    # the mover's share: its own id, the slot it fills, that slot's actions
    share = w.get(f"/v1/jobs/{jid}/workers/{mover[0]}/{mover[1]}/plan").json()
    assert share["in_plan"] and share["slot"] == list(slot)
    assert share["actions"] == [x.model_dump(mode="json") for x in plan.worker(*slot).actions]
    gone = w.get(f"/v1/jobs/{jid}/workers/0/2/plan").json()
    assert not gone["in_plan"] and gone["slot"] is None and gone["actions"] == []
    # its heartbeats count for it; its compute time is the slot's (speeds are per slot)
    assert beat(w, jid, *mover, compute_s_per_mb=0.25, compute_iteration=1).status_code == 200
    det = server.service.jobs[jid].detector
    assert list(det.reports[slot]) == [0.25] and mover not in det.reports
    # a suspect names a slot: the worker filling it is the one whose deadline is cut
    r = w.post(f"/v1/jobs/{jid}/suspects", json={"replica": slot[0], "stage": 2,
                                                "reporter": {"replica": 2, "stage": 1}})
    assert r.json()["declared_failed"] is False and r.json()["deadline_s"] <= HB_TIMEOUT / 4
    deadline = server.service.monitor.deadline[jid]
    assert deadline[mover] - time.monotonic() <= HB_TIMEOUT / 4
    empty = plan.failed[0]
    r = w.post(f"/v1/jobs/{jid}/suspects", json={"replica": empty[0], "stage": empty[1]})
    assert r.json()["declared_failed"] is True  # nobody fills it
    assert beat(w, jid, *mover).status_code == 200  # alive after all
    # the page: the grid is by worker, and says which slot the mover fills
    view = admin.get(f"/v1/page/jobs/{jid}/view").json()
    assert view["roles"][mover[0]][mover[1]] == list(slot)
    assert view["roles"][0][1] is None and view["versions"][-1]["moves"][0]["to_stage"] == 2
    # a dead worker comes back (a restarted process): it is placed, with its incarnation
    r = w.post(f"/v1/jobs/{jid}/events", json={"event_id": "back", "kind": "recovery",
                                               "replica": 0, "stage": 2, "incarnation": 2})
    assert r.status_code == 200 and r.json()["failed"] == [[0, 1], [1, 2]]
    plan = Plan.model_validate_json(w.get(f"/v1/jobs/{jid}/plan").text)
    assert plan.roles is not None and plan.slot_of("0.2") is not None
    assert plan.incarnation(0, 2) == 2 and validate(plan) == []


def test_a_node_added_takes_dead_ids_which_then_join(admin, server):
    jid, token = register_job(admin, D=2, S=4, M=4)
    w = token_client(server.url, token)
    url = f"/v1/jobs/{jid}/nodes"
    # node 3 at 2 per node (ranks 6, 7) and one more worker are gone
    assert admin.post(url, json=remove("n3", (1, 2), (1, 3))).status_code == 200
    assert admin.post(f"/v1/jobs/{jid}/events", json={
        "event_id": "f", "kind": "failure", "replica": 0, "stage": 0}).status_code == 200
    r = w.post(url, json=add("new-a", workers_per_node=2))
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["node_rank"] == 3 and a["plan_version"] == 2 and a["plan_source"] is None
    assert a["workers"] == [{"replica": 1, "stage": 2, "incarnation": 2},
                            {"replica": 1, "stage": 3, "incarnation": 2}]
    # the next add gets the id nobody was given
    b = w.post(url, json=add("new-b", count=1)).json()
    assert b["workers"] == [{"replica": 0, "stage": 0, "incarnation": 2}] and "node_rank" not in b
    r = w.post(url, json=add("new-c", count=4))
    assert r.status_code == 409 and "4 new workers but 3 vacant ids in the 2x4 grid" in r.json()["detail"]
    # the new node's workers join with their own incarnation
    for r_, s_ in [(1, 2), (1, 3)]:
        j = w.post(f"/v1/jobs/{jid}/events", json={"event_id": f"join-{r_}.{s_}",
                                                   "kind": "recovery", "replica": r_,
                                                   "stage": s_, "incarnation": 2})
        assert j.status_code == 200, j.text
    plan = Plan.model_validate_json(w.get(f"/v1/jobs/{jid}/plan").text)
    assert plan.version == 4 and plan.incarnation(1, 3) == 2 and validate(plan) == []
    assert server.service.jobs[jid].granted == {(0, 0): server.service.jobs[jid].granted[(0, 0)]}
    kinds = [(e["kind"], e.get("node_rank")) for e in admin.get(f"/v1/jobs/{jid}/events").json()]
    assert kinds == [("remove", None), ("failure", None), ("add", 3), ("add", None),
                     ("recovery", None), ("recovery", None)]


def test_a_restarted_service_rebuilds_the_same_membership(tmp_path):
    db = tmp_path / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=HB_TIMEOUT, precompute_failures=0) as s:
        with httpx.Client(base_url=s.url, headers=admin_headers(), timeout=10) as c:
            jid, _ = register_job(c, D=3, S=3, M=6)
            other, _ = register_job(c, shape="fixed", D=2, S=2, M=2)
            cut, _ = register_job(c, D=2, S=2, M=2)  # shape auto: cut, not paused
            assert c.post(f"/v1/jobs/{jid}/nodes", json=remove(
                "x", (0, 1), (0, 2), (1, 2))).json()["plan_version"] == 1
            c.post(f"/v1/jobs/{jid}/events", json={"event_id": "b", "kind": "recovery",
                                                   "replica": 0, "stage": 2}).raise_for_status()
            c.post(f"/v1/jobs/{jid}/nodes", json=add("n", count=1)).raise_for_status()
            # the other job pauses (1 live worker, 2 stages): its row keeps the deaths since
            # the plan in force, which still has two of them live
            for e, w in (("p", (0, 1)), ("q", (1, 1)), ("r", (0, 0))):
                for job in (other, cut):
                    c.post(f"/v1/jobs/{job}/events", json={
                        "event_id": e, "kind": "failure", "replica": w[0],
                        "stage": w[1]}).raise_for_status()
        before = {j: (m.members, dict(m.granted), m.adds) for j, m in s.service.jobs.items()}
        assert before[jid][0].roles is not None and before[other][0].state == "paused"
        assert before[cut][0].partition is not None and before[cut][0].state == "running"
    with ThreadServer(db, heartbeat_timeout_s=HB_TIMEOUT, precompute_failures=0) as s:
        after = {j: (m.members, dict(m.granted), m.adds) for j, m in s.service.jobs.items()}
    assert after == before


def test_a_zero_elastic_horizon_moves_nobody_into_a_short_stage(tmp_path):
    # --elastic-horizon 0: no move pays for itself, so the plan is the plain failed set
    with ThreadServer(tmp_path / "service.db", elastic_horizon=0.0, precompute_failures=0) as s, \
            httpx.Client(base_url=s.url, headers=admin_headers(), timeout=10) as c:
        jid, _ = register_job(c, D=3, S=3, M=6)
        r = c.post(f"/v1/jobs/{jid}/nodes", json=remove("x", (0, 1), (0, 2), (1, 2)))
        assert r.status_code == 200, r.text
        plan = Plan.model_validate_json(c.get(f"/v1/jobs/{jid}/plan").text)
        assert plan.roles is None and plan.failed == [(0, 1), (0, 2), (1, 2)]
        assert s.service.jobs[jid].members.horizon == 0.0


def test_a_database_from_before_moves_gets_its_column(tmp_path):
    import sqlite3

    from api.storage.sqlite_store import SCHEMA, Store
    path = str(tmp_path / "old.db")
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace("  moves_json TEXT,\n", ""))  # plan_versions as it was
    db.execute("INSERT INTO plan_versions VALUES (?,?,?,?,?,?,?,?)",
               ("j", 0, "{}", "-", "greedy", 5, "registered", 1.0))
    db.commit()
    db.close()
    store = Store(path)
    try:
        store.add_plan("j", {"version": 1, "json": "{}", "failed_key": "0:1", "solver": "greedy",
                             "period": 6, "cause": "remove:operator", "moves_json": "[]"})
        assert [(r["version"], r["moves_json"]) for r in store.plan_history("j")] == [
            (0, None), (1, "[]")]
    finally:
        store.close()


def test_a_move_counts_once_every_live_worker_says_it_entered_the_version(admin, server):
    # Until the mover has the stage's state, the donor is the stage's last copy: its death
    # then halts (no snapshots). Once every live worker's heartbeat says it entered the
    # version, the mover holds the stage and the donor's death is an ordinary failure.
    jid, token = register_job(admin, D=3, S=3, M=6)
    w = token_client(server.url, token)
    dead = [(0, 1), (0, 2), (1, 2)]
    assert admin.post(f"/v1/jobs/{jid}/nodes", json=remove("gone", *dead)).status_code == 200
    job = server.service.jobs[jid]
    [move] = Plan.model_validate_json(w.get(f"/v1/jobs/{jid}/plan").text).moves
    assert job.members.moving == {home_of(move.worker)}
    live = [(r, s) for r in range(3) for s in range(3) if (r, s) not in dead]
    for r, s in live[:-1]:
        assert beat(w, jid, r, s, entered_version=1).status_code == 200
    assert beat(w, jid, *live[-1], entered_version=0).status_code == 200
    assert job.members.moving  # one worker is still in version 0
    assert beat(w, jid, *live[-1], entered_version=1).status_code == 200
    assert not job.members.moving
    donor = (2, 2)
    r = w.post(f"/v1/jobs/{jid}/events", json={"event_id": "donor", "kind": "failure",
                                               "replica": donor[0], "stage": donor[1]})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    plan = Plan.model_validate_json(w.get(f"/v1/jobs/{jid}/plan").text)
    assert plan.slot_of(move.worker)[1] == 2 and validate(plan) == []
