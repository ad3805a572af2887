"""map_plan keeps the actions of workers whose micro-batches stay put (a speed-up for large
grids): the mapped plan must be exactly the one rebuilt action by action."""
from __future__ import annotations

from planner.solvers.backends import map_plan, solve
from planner.failures import canonicalize
from planner.job import JobSpec
from planner.plan import WorkerPlan, make_action
from planner.validate import validate


def rebuilt(plan, canon):
    perm, M = canon.perm, plan.job.microbatches

    def gmap(g):
        return None if g is None else perm[g // M] * M + g % M

    routes = [None] * len(plan.routes)
    for g, row in enumerate(plan.routes):
        routes[gmap(g)] = [perm[d] for d in row]
    workers = sorted((WorkerPlan.model_construct(
        replica=perm[w.replica], stage=w.stage,
        actions=[make_action(a.op, gmap(a.microbatch), a.start, a.end) for a in w.actions])
        for w in plan.workers), key=lambda w: (w.replica, w.stage))
    return plan.model_copy(update={"routes": routes, "workers": workers,
                                   "failed": sorted((perm[r], s) for r, s in plan.failed)})


def test_mapped_plans_equal_the_rebuilt_ones_and_reuse_unmoved_workers():
    for D, S, M, failed in [(8, 4, 4, [(5, 2)]), (8, 4, 3, [(3, 1), (6, 2)]),
                            (6, 3, 2, [(2, 0), (2, 1)]), (16, 4, 4, [(9, 3), (1, 0)])]:
        spec = JobSpec.uniform(D, S, M)
        canon = canonicalize(spec, failed)
        plan = solve(spec, list(canon.failed), "greedy")  # the canonical one
        mapped = map_plan(plan, canon)
        assert mapped.to_json() == rebuilt(plan, canon).to_json()
        assert validate(mapped) == []
        kept = [w for w in plan.workers if canon.perm[w.replica] == w.replica
                and all(a.microbatch is None or canon.perm[a.microbatch // M] == a.microbatch // M
                        for a in w.actions)]
        assert kept, "some worker stays put in these cases"
        for w in kept:
            assert mapped.worker(w.replica, w.stage).actions is w.actions


def test_the_greedy_check_of_a_renumbering_can_be_left_to_verify(tmp_path):
    """An event's lookup (verify=False) serves the mapped plan without a greedy solve;
    `verify` then makes the check: a cached plan worse than greedy of that numbering (here
    1F1B's, period 258 against 214 in the same fused synchronous mode) is replaced, and
    served from then on."""
    from planner.cache import PlanCache
    from planner.plan import Mode
    mode = Mode(split_backward=False, staggered=False)  # 1F1B's
    cache = PlanCache(str(tmp_path / "plans.sqlite"))
    job = JobSpec.uniform(3, 3, 4)
    poor = solve(job, [(0, 1)], "1f1b", mode)
    greedy = solve(job, [(2, 1)], "greedy", mode)
    assert greedy.metrics.period < poor.metrics.period
    assert cache.put(poor)
    fast = cache.get(job, [(2, 1)], mode, verify=False)  # a renumbering of the cached case
    assert fast.failed == [(2, 1)] and fast.metrics.period == poor.metrics.period
    validate(fast)
    assert cache.verify(job, [(2, 1)], mode) is True
    assert cache.verify(job, [(2, 1)], mode) is False  # once per (case, numbering)
    assert cache.get(job, [(2, 1)], mode, verify=False).metrics.period == greedy.metrics.period
    # the default lookup still checks on the spot
    other = PlanCache(str(tmp_path / "other.sqlite"))
    other.put(poor)
    assert other.get(job, [(2, 1)], mode).metrics.period == greedy.metrics.period
