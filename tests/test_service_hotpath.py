"""The failure event's hot path (api/hotpath/): the memoised renumbering equals map_plan,
the assembled JSON equals Plan.to_json, the plan cache keeps every single-failure plan of
a job parsed with its equal parts shared, and the service warms all of it during
precompute (and again after a restart), so an event neither parses nor rebuilds."""
from __future__ import annotations

import pytest
import random

import httpx

from api.hotpath.encode import JsonParts
from api.hotpath.mapping import MemoMapper
from api_support import ThreadServer, admin_headers, register_job
from planner.cache import PlanCache
from planner.failures import canonical_sets, canonicalize
from planner.job import JobSpec
from planner.plan import Move, Partition, Plan, Role
from planner.solvers.backends import map_plan, solve
from planner.validate import validate


pytestmark = pytest.mark.procs  # its fixtures or tests start processes

def test_memoised_mapping_equals_map_plan_event_after_event():
    """Many renumberings of the same canonical plans, in random order (hits and misses of
    the memo, one and two failures, failed replicas early and late): each equals map_plan's,
    is valid, and blocks that do not move are the canonical plan's own objects."""
    rng = random.Random(5)
    mapper = MemoMapper()
    for D, S, M, k in [(12, 4, 3, 1), (9, 3, 4, 2), (16, 2, 2, 2)]:
        spec = JobSpec.uniform(D, S, M)
        plans = {c.key: solve(c.job(spec), c.failed, "greedy", canonical=False)
                 for c in canonical_sets(spec, k)}
        for _ in range(40):
            failed = sorted({(rng.randrange(D), rng.randrange(S))
                             for _ in range(rng.randint(1, k))})
            canon = canonicalize(spec, failed)
            if canon.key not in plans:
                continue
            got = mapper(plans[canon.key], canon)
            want = map_plan(plans[canon.key], canon)
            assert got.to_json() == want.to_json(), (D, S, M, failed)
            assert validate(got) == []
            assert got.failed == failed
        canon = canonicalize(spec, [(0, 1)])
        plan = plans[canon.key]
        assert mapper(plan, canon) is plan  # the identity renumbering
        # replicas after the failed one whose workers run only micro-batches of replicas
        # that stay put keep their workers as they are: the canonical plan's objects
        canon = canonicalize(spec, [(1, 1)])
        base = plans[canon.key]
        still = {w.replica for w in base.workers} - {
            w.replica for w in base.workers if w.replica <= 1 or any(
                a.microbatch is not None and a.microbatch < 2 * M for a in w.actions)}
        assert still
        got = mapper(base, canon)
        assert all(w is base.worker(w.replica, w.stage) for w in got.workers
                   if w.replica in still)
    assert mapper._blocks, "renumbered blocks are memoised"


def test_memoised_mapping_leaves_jobs_with_speeds_to_map_plan():
    spec = JobSpec.uniform(4, 3, 2).model_copy(update={"speed": [[1.0, 0.5, 1.0],
                                                                  [1.0] * 3, [1.0] * 3,
                                                                  [1.0] * 3]})
    canon = canonicalize(spec, [(3, 2)])
    plan = solve(canon.job(spec), canon.failed, "greedy", canonical=False)
    assert MemoMapper()(plan, canon).to_json() == map_plan(plan, canon).to_json()


def test_assembled_json_equals_to_json_byte_for_byte():
    parts = JsonParts(limit=50)  # small: the memo is dropped and refilled on the way
    spec = JobSpec.uniform(6, 3, 2)
    cases = [solve(spec, [], "greedy"), solve(spec, [(4, 1)], "greedy"),
             solve(spec, [(4, 1)], "greedy").stamped(7, [[1, 2, 1]] + [[1] * 3] * 5),
             solve(spec.model_copy(update={"speed": [[0.5, 1.0, 1.0]] + [[1.0] * 3] * 5}),
                   [(2, 0)], "greedy")]
    roles = [Role(worker=f"{r}.{s}", replica=r, stage=s) for r in range(6) for s in range(3)
             if (r, s) != (4, 1)]  # a plan with roles and a move keeps them (part 2's format)
    cases.append(cases[1].with_roles(roles, [Move(worker="4.1", from_stage=1, to_stage=0,
                                                  bytes=10)]))
    # a plan of another shape keeps its partition (the spliced JSON once dropped it, and
    # the service's workers saw a plan of the wrong job)
    cases.append(cases[-1].model_copy(update={"partition": Partition(
        unit="stage", bounds=[0, 1, 3], base=spec.identity_hash())}))
    for _ in range(3):
        for plan in cases:
            assert parts.plan(plan) == plan.to_json()
            assert Plan.from_json(parts.plan(plan)) == plan
    # a list with the id of a dropped one is never answered from the memo
    a = solve(spec, [], "greedy")
    first = parts.actions(a.workers[0].actions)
    other = list(a.workers[1].actions)
    assert parts.actions(other) != first


def test_cache_keeps_every_single_failure_plan_parsed_with_shared_parts(tmp_path):
    """The 1 + S*1 canonical plans of a job fit the budget because equal actions, lists and
    rows are one object; a lookup from memory equals the one parsed from SQLite."""
    spec = JobSpec.uniform(16, 4, 4)
    cache = PlanCache(str(tmp_path / "c.db"), memory_actions=20_000)
    sets = list(canonical_sets(spec, 1))
    for c in sets:
        cache.put(solve(c.job(spec), c.failed, "greedy", canonical=False))
    assert len(cache._mem) == len(sets)
    actions = sum(len(w.actions) for p, _ in cache._mem.values() for w in p.workers)
    distinct = {id(a) for p, _ in cache._mem.values() for w in p.workers for a in w.actions}
    assert len(distinct) < actions / 2, (len(distinct), actions)
    cold = PlanCache(str(tmp_path / "c.db"))  # parses from SQLite
    for failed in ([], [(9, 2)], [(0, 3)], [(15, 0)]):
        assert cache.get(spec, failed).to_json() == cold.get(spec, failed).to_json()
    # the budget still bounds memory: a small one keeps fewer plans
    small = PlanCache(str(tmp_path / "c.db"), memory_actions=1_000)
    for c in sets:
        small.get(spec, list(c.failed))
    assert 0 < len(small._mem) < len(sets)
    assert small._mem_used <= 1_000


def test_service_warms_single_failure_sets_during_precompute_and_after_restart(tmp_path):
    """After precompute, an event's lookup finds its canonical plan parsed and its
    renumbering in the mapper's memo; the same after a restart (nothing recomputed)."""
    def warmed(svc, spec) -> bool:
        cache = svc.cache
        keys = {k[1] for k in cache._mem}
        ones = [c for c in canonical_sets(spec, 1) if c.failed]
        return all(c.key in keys for c in ones) and len(cache.mapper._layouts) >= len(ones)

    import time
    for restart in (False, True):
        with ThreadServer(tmp_path / "s.db", precompute_failures=1) as srv:
            admin = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
            if not restart:
                jid, _ = register_job(admin, D=8, S=4, M=4)
            spec = next(iter(srv.service.jobs.values())).spec
            jid = next(iter(srv.service.jobs))
            t0 = time.monotonic()  # precompute's state turns "done" a moment after the warm-up
            while not (warmed(srv.service, spec) and admin.get(
                    f"/v1/jobs/{jid}/precompute").json()["state"] == "done"):
                assert time.monotonic() - t0 < 30, "not warmed, or precompute not done"
                time.sleep(0.05)
            r = admin.post(f"/v1/jobs/{jid}/events", json={
                "event_id": f"f{restart}", "kind": "failure", "replica": 6, "stage": 2})
            assert r.status_code == 200 and r.json()["plan_source"] == "cache", r.text
            plan = admin.get(f"/v1/jobs/{jid}/plan").json()
            assert validate(Plan.model_validate(plan)) == [] and plan["failed"] == [[6, 2]]
            assert admin.post(f"/v1/jobs/{jid}/events", json={
                "event_id": f"r{restart}", "kind": "recovery", "replica": 6, "stage": 2}
            ).status_code == 200
            admin.close()


def test_node_shares_are_built_during_the_write_and_equal_those_built_on_demand(tmp_path):
    """Once an agent has claimed a node, an event's new version comes with every node's
    share already built (while its write waited for the fsync); they are byte for byte
    the shares built from the plan on demand, and served as such."""
    from types import SimpleNamespace

    from api.hotpath.views import node_view
    with ThreadServer(tmp_path / "s.db", precompute_failures=1) as srv:
        admin = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, _ = register_job(admin, D=6, S=4, M=4)
        assert admin.post(f"/v1/jobs/{jid}/nodes/1/attach", json={
            "agent_id": "a1", "workers_per_node": 4}).status_code == 200
        r = admin.post(f"/v1/jobs/{jid}/events", json={
            "event_id": "f", "kind": "failure", "replica": 4, "stage": 1})
        assert r.status_code == 200, r.text
        job = srv.service.jobs[jid]
        nodes = [k for k in job.views if isinstance(k, tuple) and k[0] == "node"]
        assert sorted(n for _, n, _ in nodes) == list(range(6)), "prebuilt"
        fresh = SimpleNamespace(id=jid, spec=job.spec, plan=job.plan, views={})
        for node in range(6):
            want = node_view(fresh, node, 4)
            assert job.views[("node", node, 4)] == want
            got = admin.get(f"/v1/jobs/{jid}/nodes/{node}/plan",
                            params={"workers_per_node": 4})
            assert got.status_code == 200 and got.content == want
        admin.close()


def test_whole_plans_go_gzip_compressed_once_to_clients_that_accept_it(tmp_path):
    """A large whole plan (/plan fast path and route, /plans/{v}) is gzip-compressed for a
    client that accepts it (httpx does: it decodes to the same JSON) and sent as it is to
    one that does not; both paths send the same compressed bytes, made once."""
    from api.hotpath.encode import GZIP, accepts_gzip
    assert accepts_gzip("gzip, deflate") and accepts_gzip("br;q=1, *")
    assert not accepts_gzip("gzip;q=0") and not accepts_gzip("identity") \
        and not accepts_gzip(None)
    with ThreadServer(tmp_path / "s.db", precompute_failures=0) as srv:
        admin = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, _ = register_job(admin, D=16, S=8, M=8)
        raw = srv.service.jobs[jid].plan_bytes
        assert len(raw) > 64 * 1024
        plain = admin.get(f"/v1/jobs/{jid}/plan", headers={"Accept-Encoding": "identity"})
        assert plain.content == raw and "content-encoding" not in plain.headers
        assert plain.headers["etag"] == '"v0"'
        seen = []
        for path in (f"/v1/jobs/{jid}/plan", f"/v1/jobs/{jid}/plan?x=1",
                     f"/v1/jobs/{jid}/plans/0"):
            r = admin.get(path)  # httpx: Accept-Encoding: gzip, deflate
            assert r.status_code == 200
            assert r.headers["content-encoding"] == "gzip" and r.content == raw
            assert r.headers["etag"] == '"v0-gzip"' and r.headers["vary"] == "accept-encoding"
            seen.append(int(r.headers["content-length"]))
        assert len(set(seen)) == 1 and seen[0] < len(raw) / 5
        assert len(GZIP._done) >= 1 and not GZIP._pending
        admin.close()


def test_plan_versions_are_checkpointed_after_the_commit_not_by_it(tmp_path):
    """A large version's commit writes the WAL only (durable: another connection reads it
    at once); checkpoint() then copies it into the database file. Before, the commit that
    took the WAL past 1,000 pages ran the checkpoint itself, on the event's path."""
    import os
    import sqlite3

    from api.storage.sqlite_store import Store
    path = str(tmp_path / "s.db")
    store = Store(path)
    body = '{"x":"' + "y" * 6_000_000 + '"}'  # ~1,500 pages
    record = {"version": 0, "json": body, "solver": "greedy", "period": 1, "cause": "c",
              "failed_key": "-"}
    store.create_job("j", "{}", "h", "t", 1, record, ["greedy"], 0.0)
    size = os.path.getsize(path)
    assert size < 1_000_000, "the commit did not checkpoint"
    other = sqlite3.connect(path)  # as after a crash: the WAL is read back
    assert len(other.execute("SELECT plan_json FROM plan_versions").fetchone()[0]) == len(body)
    other.close()
    store.checkpoint()
    assert os.path.getsize(path) > 6_000_000
    store.close()


def test_the_cluster_page_takes_the_whole_plan_compressed_too(tmp_path):
    with ThreadServer(tmp_path / "s.db", precompute_failures=0) as srv:
        admin = httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10)
        jid, _ = register_job(admin, D=16, S=8, M=8)
        raw = srv.service.jobs[jid].plan_bytes
        r = admin.get(f"/v1/page/jobs/{jid}/plan")
        assert r.status_code == 200 and r.content == raw
        assert r.headers["content-encoding"] == "gzip"
        assert int(r.headers["content-length"]) < len(raw) / 5
        plain = admin.get(f"/v1/page/jobs/{jid}/plan", headers={"Accept-Encoding": "identity"})
        assert plain.content == raw and "content-encoding" not in plain.headers
        admin.close()
