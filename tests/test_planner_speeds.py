"""Stragglers in the planner (docs/design.md section 8): speed-aware routing, bounds, canonical
forms and the cache with speeds. Real solvers throughout, small sizes."""
from __future__ import annotations

import pytest
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies import small_jobs

from planner.solvers.backends import SolveOptions, solve
from planner.bounds import lower_bound
from planner.cache import PlanCache
from planner.solvers.cpsat import cpsat_plan
from planner.failures import canonicalize
from planner.solvers.greedy import greedy_plan
from planner.job import JobSpec
from planner.solvers.milp import milp_plan
from planner.routing import assignment, balanced_routes, route_candidates, speed_routes
from planner.plan import Mode
from planner.validate import check, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = JobSpec.load(os.path.join(ROOT, "examples", "job.json"))
MODES = [Mode(), Mode(staggered=False), Mode(split_backward=False)]
quick = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
slow = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_speeds(job: JobSpec, cells: dict) -> JobSpec:
    speed = [[1.0] * job.stages for _ in range(job.replicas)]
    for (d, s), v in cells.items():
        speed[d][s] = v
    return JobSpec.model_validate({**job.model_dump(), "speed": speed})


def straggler_cases(max_d=3, max_s=3, max_m=3, max_actions=None):
    """A small job with speeds on the 0.1 grid (mostly nominal, some slow, now and then a
    faster worker) and failures that leave every stage a live worker."""
    return small_jobs(max_d=max_d, max_s=max_s, max_m=max_m, max_actions=max_actions, min_d=2,
                      speeds=[0.3, 0.5, 0.8, 1.0, 1.0, 1.0, 2.0])


def _work(job, d, s):
    return sum(job.duration(op, d, s) for op in "FIW")


def _slow_never_busier(job, failed, routes):
    """A worker with strictly more work per micro-batch than a live peer of its stage runs
    no more micro-batches than that peer; every live worker runs at least one."""
    counts = {k: len(v) for k, v in assignment(job, routes).items()}
    for s in range(job.stages):
        live = [d for d in range(job.replicas) if (d, s) not in failed]
        assert all(counts.get((d, s), 0) >= 1 for d in live)
        for a in live:
            for b in live:
                if _work(job, a, s) > _work(job, b, s):
                    assert counts[(a, s)] <= counts[(b, s)], (a, b, s, counts)


# ---- routing ---------------------------------------------------------------------------

def _routes_before_speeds(job, failed):
    """balanced_routes as it was before speeds counted (commit 664c96c): the reference."""
    D, S, M = job.replicas, job.stages, job.microbatches
    dead = set(failed)
    routes = [[job.owner(g)] * S for g in range(D * M)]
    for s in range(S):
        live = [d for d in range(D) if (d, s) not in dead]
        if len(live) == D:
            continue
        per_mb = {d: sum(job.duration(op, d, s) for op in "FIW") for d in live}
        load = {d: per_mb[d] * M for d in live}
        for g in [d * M + m for m in range(M) for d in range(D) if (d, s) in dead]:
            prev = routes[g][s - 1] if s > 0 else None
            best = min(live, key=lambda d: (load[d] + per_mb[d], d != prev, load[d], d))
            routes[g][s] = best
            load[best] += per_mb[best]
    return routes


@quick
@given(straggler_cases(max_d=4, max_s=4, max_m=4))
def test_without_speeds_routing_is_what_it_was(case):
    job, failed, _ = case
    plain = job.model_copy(update={"speed": None})
    assert balanced_routes(plain, failed) == _routes_before_speeds(plain, failed)
    assert route_candidates(plain, failed) == [_routes_before_speeds(plain, failed)]
    nominal = with_speeds(plain, {})  # a grid of 1.0's routes as no grid
    assert route_candidates(nominal, failed) == [_routes_before_speeds(plain, failed)]


@quick
@given(straggler_cases(max_d=4, max_s=4, max_m=4))
def test_every_candidate_routing_is_valid_and_slow_workers_shed(case):
    job, failed, _ = case
    for routes in route_candidates(job, failed):
        for g, row in enumerate(routes):
            assert all((d, s) not in failed for s, d in enumerate(row))
        _slow_never_busier(job, failed, routes)


def test_a_slow_worker_sheds_evenly_spaced_microbatches_to_its_peers():
    job = with_speeds(JobSpec.uniform(4, 3, 8), {(1, 1): 0.5})
    routes = balanced_routes(job, [])
    mine = [g for g in range(8, 16) if routes[g][1] == 1]
    assert len(mine) == 5  # 5 x 56 = 280 = 10 x 28 on the busiest peer
    kept = [g - 8 for g in mine]
    assert kept == [0, 2, 4, 6, 7] or max(b - a for a, b in zip(kept, kept[1:])) <= 2
    # Micro-batches it does not run stay on their own replica elsewhere.
    assert all(routes[g][0] == routes[g][2] == job.owner(g) for g in range(32))


# ---- every back-end, random speeds -----------------------------------------------------

@quick
@given(straggler_cases(max_d=4, max_s=4, max_m=4), st.sampled_from(["greedy", "1f1b"]))
def test_heuristic_plans_with_speeds_validate_and_respect_the_bound(case, solver):
    job, failed, mode = case
    plan = check(solve(job, failed, solver, mode))
    assert plan.metrics.period >= lower_bound(job, failed, plan_mode(plan))
    assert plan.job == job and plan.failed == failed
    _slow_never_busier(job, failed, plan.routes)


def plan_mode(plan):
    return Mode(plan.solver.split_backward, plan.solver.optimizer == "staggered")


@slow
@given(straggler_cases(max_actions=54))
def test_cpsat_with_speeds_is_valid_bounded_and_never_worse_than_greedy(case):
    job, failed, mode = case
    plan = check(solve(job, failed, "cpsat", mode, SolveOptions(time_limit=0.5)))
    assert plan.job == job and plan.failed == failed
    assert plan.metrics.lower_bound <= plan.solver.bound <= plan.metrics.period
    assert plan.metrics.period <= solve(job, failed, "greedy", mode).metrics.period
    _slow_never_busier(job, failed, plan.routes)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(straggler_cases(max_d=2, max_s=2, max_m=3, max_actions=18))
def test_milp_with_speeds_agrees_with_cpsat(case):
    job, failed, mode = case
    m = check(milp_plan(job, failed, mode, time_limit=3))
    c = check(cpsat_plan(job, failed, mode, time_limit=1, use_bound=False))
    assert m.routes == c.routes  # both take the greedy back-end's routing
    assert lower_bound(job, failed, mode) <= min(m.metrics.period, c.metrics.period)
    if m.solver.status == "OPTIMAL" and c.solver.status == "OPTIMAL":
        assert m.metrics.period == c.metrics.period
    assert c.metrics.period >= m.solver.bound and m.metrics.period >= c.solver.bound


# ---- the issue's example ---------------------------------------------------------------

def test_issue_example_sheds_the_slow_workers_microbatches():
    job = with_speeds(EXAMPLE, {(1, 2): 0.5})
    keep = greedy_plan(job, [], routes=speed_routes(job, [], "keep"))
    assert keep.metrics.period == 458  # the slow worker kept its 8: what the issue saw
    plan = check(solve(job, [], "greedy"))
    bound = plan.metrics.lower_bound
    assert bound == 285
    assert plan.metrics.period <= 1.05 * bound  # 290 when this was written
    cp = check(solve(job, [], "cpsat", opts=SolveOptions(time_limit=3)))
    assert bound <= cp.metrics.period <= plan.metrics.period
    # With a failure in the same stage too: never worse than the slow worker keeping its share.
    failed = [(2, 2)]
    keep = greedy_plan(job, failed, routes=speed_routes(job, failed, "keep"))
    plan = check(solve(job, failed, "greedy"))
    assert plan.metrics.period <= keep.metrics.period
    assert plan.metrics.period <= 1.05 * plan.metrics.lower_bound


@quick
@given(straggler_cases(max_d=4, max_s=4, max_m=4))
def test_greedy_is_never_worse_than_keeping_the_slow_workers_share(case):
    job, failed, mode = case
    keep = greedy_plan(job, failed, mode, routes=speed_routes(job, failed, "keep"))
    assert solve(job, failed, "greedy", mode).metrics.period <= keep.metrics.period


# ---- canonical forms and the cache -----------------------------------------------------

@quick
@given(straggler_cases(max_d=4, max_s=3, max_m=2), st.data())
def test_canonical_form_with_speeds_round_trips(case, data):
    job, failed, _ = case
    canon = canonicalize(job, failed)
    assert sorted((canon.perm[c], s) for c, s in canon.failed) == failed
    cjob = canon.job(job)
    assert [cjob.speed[c] for c in range(job.replicas)] == [job.speed[d] for d in canon.perm]
    again = canonicalize(cjob, list(canon.failed))  # a canonical case is its own form
    assert again.perm == tuple(range(job.replicas)) and again.key == canon.key
    # Renumbering the replicas (speed rows and failures alike) keeps the canonical key.
    perm = data.draw(st.permutations(range(job.replicas)))
    moved = job.model_copy(update={"speed": [job.speed[perm.index(d)]
                                             for d in range(job.replicas)]})
    moved_failed = sorted((perm[d], s) for d, s in failed)
    assert canonicalize(moved, moved_failed).key == canon.key
    # A plan solved for the canonical case maps back to the job and failed set asked for.
    plan = check(solve(job, failed, "greedy", canonical=True))
    assert plan.job == job and plan.failed == failed


def test_quantised_speeds_make_patterns_repeat():
    base = JobSpec.uniform(3, 3, 2)
    a = canonicalize(with_speeds(base, {(1, 2): 0.5}), [(0, 0)])
    b = canonicalize(with_speeds(base, {(2, 2): 0.5}), [(0, 0)])
    assert a.key == b.key == "0:0|1:2@0.5"
    near = canonicalize(with_speeds(base, {(2, 2): 0.52}), [(0, 0)])
    assert near.key == a.key  # 0.52 quantises to 0.5


def test_cache_serves_a_speed_pattern_to_every_renumbering(tmp_path):
    cache = PlanCache(str(tmp_path / "plans.sqlite"))
    base = JobSpec.uniform(3, 3, 4)
    one = with_speeds(base, {(1, 1): 0.5})
    other = with_speeds(base, {(2, 1): 0.5})
    assert cache.put(solve(one, [(0, 2)], "greedy"))
    hit = check(cache.get(other, [(1, 2)]))  # the same case, renumbered
    assert hit.job == other and hit.failed == [(1, 2)]
    assert cache.count(base) == cache.count(other) == 1
    # Off the 0.1 grid a job is cached exactly: 0.52 does not get 0.5's plan.
    assert cache.get(with_speeds(base, {(1, 1): 0.52}), [(0, 2)]) is None


def test_a_cached_plan_worse_than_greedy_is_not_served(tmp_path):
    # Regression: a plan routed before speeds counted (the slow worker keeps its share)
    # sat in the cache and was served, 458 against greedy's 290.
    cache = PlanCache(str(tmp_path / "plans.sqlite"))
    job = with_speeds(EXAMPLE, {(1, 2): 0.5})
    stale = greedy_plan(job, [], routes=speed_routes(job, [], "keep"))
    assert cache.put(stale)
    got = check(cache.get(job, []))
    assert got.metrics.period <= solve(job, [], "greedy").metrics.period < stale.metrics.period
    # The better plan replaced the stale one, for this process and the next.
    assert PlanCache(str(tmp_path / "plans.sqlite")).get(job, []).metrics.period \
        == got.metrics.period


def test_bound_balances_by_speed():
    # Two workers, one at half speed, one stage: 8 micro-batches of F+I+W = 28 (56 slow).
    # The best split is 6 + 2 or 5 + 3 (168 on the busiest); with equal speeds 4 + 4 (112).
    job = JobSpec.model_validate({"replicas": 2, "stages": 1, "microbatches": 4,
                                  "cost": {"F": [10], "I": [10], "W": [8], "OPT": [5]}})
    slowed = with_speeds(job, {(1, 0): 0.5})
    assert lower_bound(job, []) >= 4 * 28 + 5
    assert lower_bound(slowed, []) >= 6 * 28 + 5
    opt = cpsat_plan(slowed, [], time_limit=2, use_bound=False)
    assert opt.solver.status == "OPTIMAL"
    assert lower_bound(slowed, []) <= opt.metrics.period


def _minmax_by_heap(job, live, cost):
    """The bound's balance as it was computed before (one unit at a time to the worker
    whose cost grows least): the reference for the bisection."""
    import heapq
    count = {d: 0 for d in live}
    heap = [(cost(d, 1), d) for d in live]
    heapq.heapify(heap)
    for _ in range(job.num_microbatches):
        _, d = heapq.heappop(heap)
        count[d] += 1
        heapq.heappush(heap, (cost(d, count[d] + 1), d))
    return max(cost(d, count[d]) for d in live)


@quick
@given(straggler_cases(max_d=4, max_s=4, max_m=6), st.integers(0, 60))
def test_bound_balance_by_bisection_matches_the_greedy_balance(case, chain):
    from planner.bounds import _busy_until_last_i, _minmax, span_bound
    job, failed, _ = case
    for s in range(job.stages):
        live = [d for d in range(job.replicas) if (d, s) not in failed]
        for cost in (lambda d, n: span_bound(job, d, s, n, chain),
                     lambda d, n: _busy_until_last_i(job, d, s, n, chain)):
            assert _minmax(job, s, live, cost) == _minmax_by_heap(job, live, cost)


def test_cpsat_shares_its_time_among_greedys_near_best_routings(monkeypatch):
    # Which routing lets CP-SAT close the gap shows only in the solve, so it runs on each
    # routing within 1% of greedy's best (here two), half the time each, and keeps the best.
    # The comparison needs reproducible solves: deterministic time only, no wall-time cap
    # (on a loaded machine the cap stops the solves at different points of the search).
    from planner.solvers import cpsat
    from planner.solvers.greedy import ranked_schedules
    monkeypatch.setattr(cpsat, "_WALL_CAP", 20.0)
    job = with_speeds(JobSpec.uniform(3, 4, 4), {(1, 2): 0.7})
    ranked = ranked_schedules(job, [], Mode())
    close = [r for r in ranked[:2] if r[0] <= 1.01 * ranked[0][0]]
    assert len(close) == 2
    each = [cpsat_plan(job, [], time_limit=0.5, routes=routes, hint=tl).metrics.period
            for _, routes, tl in close]
    plan = check(cpsat_plan(job, [], time_limit=1))
    assert plan.metrics.period == min(each) <= ranked[0][0]


@pytest.mark.procs
def test_speeds_benchmark_command(tmp_path):
    import subprocess
    import sys

    def recycle(*args):
        return subprocess.run([sys.executable, "-m", "recycle.cli", "bench", "planner",
                               "--speeds", *args], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
    bad = recycle("--time-limit", "0")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "--time-limit must be positive" in bad.stderr
    out = tmp_path / "speeds.md"
    ok = recycle("--no-cpsat", "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    text = out.read_text()
    assert "Made by `recycle bench planner --speeds --no-cpsat`" in text
    row = next(line for line in text.splitlines()
               if line.startswith("| examples/job.json | 1:2 | 0.5 | - | 285 | 458 | - | "))
    assert int(row.split("|")[8].split()[0]) <= 290, row  # greedy: within 2% of the bound


def test_least_finishing_load_keeps_a_slower_worker_no_busier():
    """Regression: the "lfl" routing reserved each worker's one micro-batch after dealing,
    which gave worker 1:0 (speed 0.8) two micro-batches and 3:0 (speed 1.0) one."""
    job = JobSpec.model_validate({
        "replicas": 4, "stages": 1, "microbatches": 1,
        "cost": {"F": [1], "I": [1], "W": [3], "OPT": [1]}, "p2p": {"intra": 0, "cross": 0},
        "speed": [[0.3], [0.8], [0.3], [1.0]]})
    for routes in route_candidates(job, [(0, 0)]):
        _slow_never_busier(job, [(0, 0)], routes)
