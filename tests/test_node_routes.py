"""The service's node routes (api/nodes/): claims, one heartbeat for a node's workers, and
the bad input an agent can send (a real uvicorn on loopback)."""
from __future__ import annotations

import httpx
import pytest

from api_support import ThreadServer, admin_headers, register_job, token_client
from executor.node.agent import worker_share

pytestmark = pytest.mark.hard_timeout(60)


@pytest.fixture
def served(tmp_path):
    with ThreadServer(tmp_path / "s.db", heartbeat_timeout_s=2.0) as srv:
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10) as admin:
            jid, token = register_job(admin, D=2, S=3, M=2)  # 6 workers: nodes 0..1 at 4
            with token_client(srv.url, token) as c:
                yield srv, jid, c


def claim(c, jid, node, agent="a", k=4):
    return c.post(f"/v1/jobs/{jid}/nodes/{node}/attach",
                  json={"agent_id": agent, "workers_per_node": k})


def beat(c, jid, node, cells, agent="a", k=4, **extra):
    return c.post(f"/v1/jobs/{jid}/nodes/{node}/heartbeats", json={
        "agent_id": agent, "workers_per_node": k,
        "workers": [{"replica": r, "stage": s, "iteration": 0, **extra} for r, s in cells]})


def test_claim_names_the_node_workers_in_rank_order(served):
    _, jid, c = served
    r = claim(c, jid, 1)
    assert r.status_code == 200, r.text
    assert [(w["replica"], w["stage"]) for w in r.json()["workers"]] == [(1, 1), (1, 2)]
    assert r.json()["plan_version"] == 0


def test_node_rank_outside_the_job_is_a_clear_422(served):
    _, jid, c = served
    for node in (2, 1000):
        r = claim(c, jid, node)
        assert r.status_code == 422
        assert r.json()["detail"] == (f"node rank {node} is outside job {jid}: its 6 workers "
                                      "at 4 per node make nodes 0..1")
    assert beat(c, jid, 2, [(0, 0)]).status_code == 422
    assert claim(c, jid, -1).status_code == 422  # the path's own bound


def test_a_second_agent_for_a_held_node_is_409_until_the_first_detaches(served):
    _, jid, c = served
    assert claim(c, jid, 0, agent="first").status_code == 200
    r = claim(c, jid, 0, agent="second")
    assert r.status_code == 409
    assert r.json()["detail"].startswith(f"node 0 of job {jid} is held by agent first (heard ")
    assert "\n" not in r.json()["detail"]
    assert beat(c, jid, 0, [(0, 0)], agent="second").status_code == 409
    assert claim(c, jid, 0, agent="first").status_code == 200  # the holder renews
    d = c.post(f"/v1/jobs/{jid}/nodes/0/detach", json={"agent_id": "second",
                                                       "workers_per_node": 4})
    assert d.json() == {"released": False, "reason": "held by agent first"}
    d = c.post(f"/v1/jobs/{jid}/nodes/0/detach", json={"agent_id": "first",
                                                       "workers_per_node": 4})
    assert d.json()["released"] is True
    assert claim(c, jid, 0, agent="second").status_code == 200


def test_a_silent_holder_loses_its_node_after_the_heartbeat_timeout(served):
    import time
    _, jid, c = served
    assert claim(c, jid, 0, agent="dead").status_code == 200
    time.sleep(2.1)  # the service's heartbeat timeout: a replacement machine takes over
    assert claim(c, jid, 0, agent="new").status_code == 200


def test_another_node_size_is_409_and_other_nodes_workers_422(served):
    _, jid, c = served
    assert claim(c, jid, 0).status_code == 200
    r = claim(c, jid, 1, agent="b", k=2)
    assert r.status_code == 409 and "nodes have 4 workers each; this agent says 2" in r.text
    r = beat(c, jid, 0, [(0, 0), (1, 2)])
    assert r.status_code == 422
    assert r.json()["detail"] == "worker 1:2 is not on node 0 (ranks 0..3)"


def test_bad_tokens_and_bodies_are_4xx(served):
    srv, jid, c = served
    r = httpx.post(f"{srv.url}/v1/jobs/{jid}/nodes/0/attach",
                   json={"agent_id": "a", "workers_per_node": 4})
    assert r.status_code == 401
    r = httpx.post(f"{srv.url}/v1/jobs/{jid}/nodes/0/attach", headers=admin_headers("nope"),
                   json={"agent_id": "a", "workers_per_node": 4})
    assert r.status_code == 401
    for body in ({"agent_id": "a"}, {"agent_id": "", "workers_per_node": 4},
                 {"agent_id": "a", "workers_per_node": 0},
                 {"agent_id": "a", "workers_per_node": 4, "workers": [{"replica": 0}]}):
        r = c.post(f"/v1/jobs/{jid}/nodes/0/heartbeats", json=body)
        assert r.status_code == 422 and "\n" not in r.json()["detail"], r.text
    assert c.post("/v1/jobs/nope/nodes/0/attach",
                  json={"agent_id": "a", "workers_per_node": 4}).status_code in (403, 404)


def test_one_node_heartbeat_keeps_every_worker_alive_and_lists_refusals(served):
    import time
    srv, jid, c = served
    cells = [(0, 0), (0, 1), (0, 2), (1, 0)]
    ev = c.post(f"/v1/jobs/{jid}/events", json={"event_id": "f", "kind": "failure",
                                                "replica": 0, "stage": 1})
    assert ev.status_code == 200, ev.text
    for _ in range(6):  # 3 s > the 2 s timeout: only the heartbeats keep them alive
        r = beat(c, jid, 0, cells)
        assert r.status_code == 200, r.text
        time.sleep(0.5)
    body = r.json()
    assert [(x["replica"], x["stage"], x["status"]) for x in body["refused"]] == [(0, 1, 409)]
    assert body["incarnations"] == [1, 1, 1, 1]
    job = c.get(f"/v1/jobs/{jid}").json()
    assert job["failed"] == [[0, 1]]  # the beaten ones were never declared failed
    # node 1's workers never beat: they are not watched (armed by a first heartbeat only)
    assert beat(c, jid, 0, [(0, 0)], incarnation=7).json()["refused"][0]["status"] == 409


def test_the_node_share_is_each_worker_share_once(served):
    srv, jid, c = served
    node = c.get(f"/v1/jobs/{jid}/nodes/1/plan", params={"workers_per_node": 4})
    assert node.status_code == 200, node.text
    share = node.json()
    assert share["node_rank"] == 1 and share["version"] == 0
    for entry in share["workers"]:  # the agent's cut of each worker is the service's share
        one = c.get(f"/v1/jobs/{jid}/workers/{entry['replica']}/{entry['stage']}/plan").json()
        assert worker_share(share, (entry["replica"], entry["stage"])) == one
        assert one["routes"] and set(one["routes"]) <= set(share["routes"])
    assert [(w["replica"], w["stage"]) for w in share["workers"]] == [(1, 1), (1, 2)]
    # the fast path and the route answer alike ("0e0": not a plain number, so the route)
    slow = c.get(f"/v1/jobs/{jid}/nodes/1/plan", params={"workers_per_node": 4, "wait": "0e0"})
    assert slow.content == node.content
    assert c.get(f"/v1/jobs/{jid}/nodes/1/plan",
                 params={"workers_per_node": 4, "after": 0, "wait": 0.2}).status_code == 204
    bad = c.get(f"/v1/jobs/{jid}/nodes/2/plan", params={"workers_per_node": 4})
    assert bad.status_code == 422 and "outside job" in bad.json()["detail"]
    assert c.get(f"/v1/jobs/{jid}/nodes/0/plan").status_code == 422  # no workers_per_node


def test_heartbeats_answer_alike_on_the_fast_path_and_through_the_routes(served):
    """A query string sends a heartbeat the long way (FastAPI); without one the fast path
    answers: same status, same bytes, for worker and node heartbeats, taken or refused."""
    _, jid, c = served
    assert c.post(f"/v1/jobs/{jid}/events", json={"event_id": "f", "kind": "failure",
                                                  "replica": 0, "stage": 1}).status_code == 200
    node = {"agent_id": "a", "workers_per_node": 4,
            "workers": [{"replica": 0, "stage": s, "iteration": 3} for s in (0, 1, 2)]}
    cases = [("/heartbeats", {"replica": 1, "stage": 0, "iteration": 2}),
             ("/heartbeats", {"replica": 0, "stage": 1, "iteration": 2}),      # failed: 409
             ("/heartbeats", {"replica": 9, "stage": 0, "iteration": 2}),      # outside: 422
             ("/heartbeats", {"replica": 1, "stage": 0, "iteration": -1}),     # invalid: 422
             ("/nodes/0/heartbeats", node),
             ("/nodes/0/heartbeats", {**node, "workers": [{"replica": 1, "stage": 2,
                                                           "iteration": 0}]}),  # 422
             ("/nodes/5/heartbeats", node),                                    # 422
             ("/nodes/0/heartbeats", {**node, "agent_id": "b"})]               # 409
    for path, body in cases:
        fast = c.post(f"/v1/jobs/{jid}{path}", json=body)
        slow = c.post(f"/v1/jobs/{jid}{path}?via=route", json=body)
        assert (fast.status_code, fast.content) == (slow.status_code, slow.content), path
        assert fast.status_code < 500
    assert [c.post(f"/v1/jobs/{jid}{p}", json=b).status_code for p, b in cases] == \
        [200, 409, 422, 422, 200, 422, 422, 409]
