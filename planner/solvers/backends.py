"""Back-ends by name, and the one entry point everything calls: `solve`.

`solve` plans the canonical form of the failed set and maps the plan back to the real
replica numbers, so the same plan is reused (and cached) for every symmetric failure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from planner.failures import Canonical, Worker, canonicalize, check_plannable, normalize
from planner.job import JobSpec
from planner.plan import Plan, WorkerPlan, make_action
from planner.plan import Mode
from planner.errors import UserError


@dataclass(frozen=True)
class SolveOptions:
    time_limit: float = 10.0
    num_workers: int = 2
    seed: int = 0


def _greedy(job, failed, mode, opts):
    from planner.solvers.greedy import greedy_plan
    return greedy_plan(job, failed, mode)


def _1f1b(job, failed, mode, opts):
    from planner.solvers.greedy import one_f_one_b_plan
    return one_f_one_b_plan(job, failed)


def _cpsat(job, failed, mode, opts, start: Optional[Plan] = None):
    from planner.solvers.cpsat import cpsat_plan
    hint = routes = None
    if start is not None:  # a plan for these failures to improve on (same numbering)
        routes = start.routes
        hint = {w.key: [(a.op, a.microbatch, a.start, a.end) for a in w.actions if a.op != "OPT"]
                for w in start.workers}
    return cpsat_plan(job, failed, mode, time_limit=opts.time_limit,
                      num_workers=opts.num_workers, seed=opts.seed, routes=routes, hint=hint)


def _milp(job, failed, mode, opts):
    from planner.solvers.milp import milp_plan
    return milp_plan(job, failed, mode, time_limit=opts.time_limit)


BACKENDS: dict[str, Callable[[JobSpec, list[Worker], Mode, SolveOptions], Plan]] = {
    "1f1b": _1f1b, "greedy": _greedy, "cpsat": _cpsat, "milp": _milp,
}


class UnknownBackend(UserError):
    pass


def solve(job: JobSpec, failed: Iterable[Iterable[int]], solver: str = "greedy",
          mode: Mode = Mode(), opts: SolveOptions = SolveOptions(),
          canonical: Optional[bool] = None) -> Plan:
    """Plan for `failed` with the named back-end. Raises NoPlanError when a stage has no
    live worker, FailedSetError for workers outside the grid. `canonical` (default: for
    the slow solvers) solves the canonical failed set and maps the plan back, so that
    symmetric failures get the same plan; the fast heuristics plan the set as given."""
    if solver not in BACKENDS:
        raise UnknownBackend(f"unknown solver {solver!r}; choose one of {', '.join(BACKENDS)}")
    failed = normalize(job, failed)
    check_plannable(job, failed)
    if canonical is None:
        canonical = solver in ("cpsat", "milp")
    if not canonical:
        return BACKENDS[solver](job, failed, mode, opts)
    canon = canonicalize(job, failed)
    cjob = canon.job(job)  # with stragglers, the speeds renumbered too
    if solver == "cpsat" and list(canon.perm) != sorted(canon.perm):
        # The greedy plan depends on the numbering (ties go to lower replicas), so the
        # greedy plan of the numbering asked for may beat the canonical one: CP-SAT starts
        # from the better of the two (its own routing search when that is the canonical
        # one), and so is never worse than either.
        asked = map_plan(_greedy(job, failed, mode, opts), canon.inverse())
        own = _greedy(cjob, list(canon.failed), mode, opts)
        start = asked if asked.metrics.period < own.metrics.period else None
        plan = _cpsat(cjob, list(canon.failed), mode, opts, start=start)
    else:
        plan = BACKENDS[solver](cjob, list(canon.failed), mode, opts)
    return map_plan(plan, canon)


def map_plan(plan: Plan, canon: Canonical) -> Plan:
    """Rename replicas of a plan solved for `canon.failed` back to the original ones.
    Micro-batch g of canonical replica c is micro-batch m of original replica perm[c];
    speed row c of the plan's job becomes row perm[c]."""
    perm = canon.perm
    if list(perm) == sorted(perm):
        return plan
    job = plan.job
    M = job.microbatches
    if job.speed is not None:  # the plan's job is renumbered with it
        speed = [None] * len(perm)
        for c, row in enumerate(job.speed):
            speed[perm[c]] = list(row)
        job = job.model_copy(update={"speed": speed})

    def gmap(g):
        return None if g is None else perm[g // M] * M + g % M

    routes = [None] * len(plan.routes)
    for g, row in enumerate(plan.routes):
        routes[gmap(g)] = [perm[d] for d in row]
    # One failure moves only the replicas before it in the canonical order: a worker whose
    # micro-batches all belong to replicas that stay put keeps its actions as they are
    # (immutable), which spares most of the rebuilding on large grids.
    moved = [perm[c] != c for c in range(len(perm))]

    def actions(w):
        if not any(a.microbatch is not None and moved[a.microbatch // M] for a in w.actions):
            return w.actions
        return [a if a.microbatch is None or not moved[a.microbatch // M]
                else make_action(a.op, gmap(a.microbatch), a.start, a.end) for a in w.actions]

    workers = sorted(
        (WorkerPlan.model_construct(replica=perm[w.replica], stage=w.stage, actions=actions(w))
         for w in plan.workers), key=lambda w: (w.replica, w.stage))
    failed = sorted((perm[r], s) for r, s in plan.failed)
    return plan.model_copy(update={"job": job, "routes": routes, "workers": workers,
                                   "failed": failed})
