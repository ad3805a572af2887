"""Routing: which replica runs stage s of micro-batch g.

Each stage's micro-batches go to its live workers in proportion to what they can do
(docs/design.md section 8): counts minimise the busiest worker's work, n_d x (F+I+W on d), so a
slow worker sheds micro-batches to its same-stage peers exactly as a failed one (speed 0)
sheds all of them. A worker keeps as many of its own replica's micro-batches as its count
allows; the rest (a failed worker's, a slow worker's surplus) form a pool that is dealt
out in micro-batch order to the least finishing load, so each peer receives evenly spaced
micro-batches rather than a block. Ties prefer the replica that ran the previous stage of
the same micro-batch: consecutive failures in one replica keep the detour on one peer
pipeline (intra-replica delay). With no speeds, every live worker keeps all its own
micro-batches and only failed workers' move.

Which micro-batches a slow worker sheds, and whether shedding pays at all, depends on the
schedule, so `route_candidates` offers a few routings and the back-ends keep the best.
"""
from __future__ import annotations

import heapq
from collections import defaultdict

from planner.failures import Worker, check_plannable, normalize
from planner.job import JobSpec

Routes = list[list[int]]
# Routings `route_candidates` offers, in order: the proportional one shedding evenly spaced
# micro-batches, or its last ones; today's "keep" (a live worker keeps all its own); and
# "lfl", every micro-batch dealt to the least finishing load (owner first on ties).
SHED = ("even", "tail", "keep", "lfl")


def _work(job: JobSpec, d: int, s: int) -> int:
    return sum(job.duration(op, d, s) for op in "FIW")


def proportional_counts(job: JobSpec, live: list[int], s: int) -> dict[int, int]:
    """Micro-batches per live worker of stage s minimising max n_d x work_d given n_d >= 1:
    one unit at a time to the worker whose load grows least (optimal for linear costs;
    ties: lower d). At least one each: a live worker that ran nothing would report no
    compute time, so the straggler detector (planner/speeds.py) could never see it recover;
    one micro-batch at speed >= 0.1 costs at most ten nominal ones."""
    work = {d: _work(job, d, s) for d in live}
    count = {d: 1 for d in live}
    heap = [(2 * work[d], d) for d in live]
    heapq.heapify(heap)
    for _ in range(job.num_microbatches - len(live)):
        _, d = heapq.heappop(heap)
        count[d] += 1
        heapq.heappush(heap, ((count[d] + 1) * work[d], d))
    return count


def _spread(M: int, k: int) -> list[int]:
    """k of the indices 0..M-1, evenly spaced (Bresenham), the last one included."""
    return [m for m in range(M) if (m + 1) * k // M > m * k // M]


def speed_routes(job: JobSpec, failed: list[Worker], shed: str = "even") -> Routes:
    """One routing (see SHED for the choices)."""
    failed = normalize(job, failed)
    check_plannable(job, failed)
    D, S, M = job.replicas, job.stages, job.microbatches
    dead = set(failed)
    routes = [[job.owner(g)] * S for g in range(D * M)]
    for s in range(S):
        live = [d for d in range(D) if (d, s) not in dead]
        work = {d: _work(job, d, s) for d in live}
        uniform = len(set(work.values())) == 1
        if len(live) == D and (uniform or shed == "keep"):
            continue  # nothing to move
        if shed == "lfl" and not uniform:
            # At least one each, as in proportional_counts: every live worker keeps its last
            # own micro-batch, counted in its load, and the rest are dealt. (Reserving after
            # the deal broke its balance: a slower worker could end up with more.)
            pool = [(m, d) for m in range(M) for d in range(D) if m < M - 1 or d not in work]
            _deal(routes, s, pool, live, work, dict(work), M, owner_first=True)
            continue
        keep = {d: M for d in live}
        if not uniform and shed != "keep":
            keep = {d: min(M, n) for d, n in proportional_counts(job, live, s).items()}
        pool = [(m, d) for d in range(D) if (d, s) in dead for m in range(M)]
        for d in live:
            gone = M - keep[d]
            if gone:
                pool += [(m, d) for m in (_spread(M, gone) if shed == "even"
                                          else range(M - gone, M))]
        _deal(routes, s, sorted(pool), live, work, {d: keep[d] * work[d] for d in live}, M)
    return routes


def _deal(routes: Routes, s: int, pool: list[tuple[int, int]], live: list[int],
          work: dict[int, int], load: dict[int, int], M: int, owner_first: bool = False):
    """Give each (m, replica) of `pool`, in order, to the live worker that would finish
    it first; ties: the owner (when `owner_first`), then the previous stage's replica."""
    for m, owner in pool:
        g = owner * M + m
        prev = routes[g][s - 1] if s > 0 else None
        best = min(live, key=lambda d: (load[d] + work[d], owner_first and d != owner,
                                        d != prev, load[d], d))
        routes[g][s] = best
        load[best] += work[best]


def balanced_routes(job: JobSpec, failed: list[Worker]) -> Routes:
    """The default routing: proportional to speed, shedding evenly spaced micro-batches.
    Without speeds, exactly the routing of failed workers' micro-batches alone."""
    return speed_routes(job, failed, "even")


def route_candidates(job: JobSpec, failed: list[Worker], limit: int = len(SHED)) -> list[Routes]:
    """Up to `limit` distinct routings worth scheduling, the default first (one without
    speeds)."""
    if job.speed is None:
        return [balanced_routes(job, failed)]
    out: list[Routes] = []
    for shed in SHED:
        if len(out) >= limit:
            break
        r = speed_routes(job, failed, shed)
        if r not in out:
            out.append(r)
    return out


def assignment(job: JobSpec, routes: Routes) -> dict[Worker, list[int]]:
    """Micro-batches each worker runs, in increasing g."""
    out: dict[Worker, list[int]] = defaultdict(list)
    for g, row in enumerate(routes):
        for s, d in enumerate(row):
            out[(d, s)].append(g)
    return dict(out)


def check_routes(job: JobSpec, failed: list[Worker], routes: Routes) -> list[str]:
    """Reasons the routes are unusable (empty when they are fine)."""
    errs = []
    D, S = job.replicas, job.stages
    if len(routes) != job.num_microbatches:
        return [f"routes has {len(routes)} rows, expected {job.num_microbatches}"]
    dead = set(failed)
    for g, row in enumerate(routes):
        if len(row) != S:
            errs.append(f"routes[{g}] has {len(row)} entries, expected {S}")
            continue
        for s, d in enumerate(row):
            if not 0 <= d < D:
                errs.append(f"routes[{g}][{s}]={d} is not a replica")
            elif (d, s) in dead:
                errs.append(f"micro-batch {g} stage {s} routed to failed worker {d}:{s}")
    return errs
