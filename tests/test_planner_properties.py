"""Property tests of the planner: every plan validates, bounds hold, symmetry round-trips."""
import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from planner.solvers.backends import solve
from planner.bounds import lower_bound
from planner.failures import NoPlanError, canonicalize
from planner.routing import assignment, balanced_routes
from planner.plan import Mode
from planner.validate import check, validate
from tests.strategies import job_and_failures

MODES = [Mode(True, True), Mode(True, False), Mode(False, True), Mode(False, False)]
fast = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(job_and_failures(speed=True), st.sampled_from(MODES), st.sampled_from(["greedy", "1f1b"]))
def test_every_heuristic_plan_validates_and_respects_its_bound(case, mode, solver):
    job, failed = case
    plan = solve(job, failed, solver, mode)
    assert validate(plan) == []
    check(plan)
    assert plan.metrics.period >= plan.metrics.lower_bound
    assert plan.failed == failed
    live = {(d, s) for d in range(job.replicas) for s in range(job.stages)} - set(failed)
    assert {(w.replica, w.stage) for w in plan.workers} == live


@fast
@given(job_and_failures(speed=True))
def test_canonical_form_round_trips(case):
    job, failed = case
    canon = canonicalize(job, failed)
    # Mapping the canonical set back through the permutation gives the original set.
    assert sorted((canon.perm[c], s) for c, s in canon.failed) == failed
    # Any relabelling of interchangeable replicas has the same canonical key.
    if job.speed is None:
        shift = {d: (d + 1) % job.replicas for d in range(job.replicas)}
        rotated = sorted((shift[d], s) for d, s in failed)
        assert canonicalize(job, rotated).failed == canon.failed
    # A plan solved for the canonical set and mapped back is valid for the original set.
    assert validate(solve(job, failed, "greedy", canonical=True)) == []


@fast
@given(job_and_failures())
def test_routing_balances_and_keeps_own_microbatches(case):
    job, failed = case
    routes = balanced_routes(job, failed)
    counts = {k: len(v) for k, v in assignment(job, routes).items()}
    for s in range(job.stages):
        live = [counts.get((d, s), 0) for d in range(job.replicas) if (d, s) not in failed]
        assert sum(live) == job.num_microbatches
        if job.speed is None:
            assert max(live) - min(live) <= 1
    for g in range(job.num_microbatches):
        for s in range(job.stages):
            if (job.owner(g), s) not in failed:
                assert routes[g][s] == job.owner(g)


def test_routing_spreads_evenly_over_peers():
    from planner.job import JobSpec
    job = JobSpec.uniform(4, 3, 6)
    counts = {k: len(v) for k, v in assignment(job, balanced_routes(job, [(1, 1)])).items()}
    assert sorted(counts[(d, 1)] for d in (0, 2, 3)) == [8, 8, 8]
    job = JobSpec.uniform(3, 2, 4)
    routes = balanced_routes(job, [(0, 0), (0, 1)])  # two failures in one replica
    assert all(routes[g][0] == routes[g][1] for g in range(4)), "detour should stay on one peer"


@pytest.mark.parametrize("failed,stage", [([(0, 1), (1, 1)], 1), ([(0, 0), (1, 0), (0, 2)], 0)])
def test_a_stage_with_no_live_replica_has_no_plan(failed, stage):
    from planner.job import JobSpec
    job = JobSpec.uniform(2, 3, 2)
    with pytest.raises(NoPlanError, match=f"no plan: stage {stage} has no live replica, restore from checkpoint"):
        solve(job, failed)
    with pytest.raises(NoPlanError):
        lower_bound(job, failed)
