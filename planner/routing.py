"""Routing: which replica runs stage s of micro-batch g.

A live worker keeps its own replica's micro-batches. A failed worker's micro-batches are
spread over the live workers of its stage by least finishing load (speed-aware), taken in
micro-batch order so each peer receives evenly spaced micro-batches rather than a block.
Ties prefer the replica that ran the previous stage of the same micro-batch: consecutive
failures in one replica then keep the detour on one peer pipeline (intra-replica delay).
"""
from __future__ import annotations

from collections import defaultdict

from planner.failures import Worker, check_plannable, normalize
from planner.job import JobSpec

Routes = list[list[int]]


def balanced_routes(job: JobSpec, failed: list[Worker]) -> Routes:
    failed = normalize(job, failed)
    check_plannable(job, failed)
    D, S, M = job.replicas, job.stages, job.microbatches
    dead = set(failed)
    routes = [[job.owner(g)] * S for g in range(D * M)]
    for s in range(S):
        live = [d for d in range(D) if (d, s) not in dead]
        if len(live) == D:
            continue
        per_mb = {d: sum(job.duration(op, d, s) for op in "FIW") for d in live}
        load = {d: per_mb[d] * M for d in live}
        orphans = [d * M + m for m in range(M) for d in range(D) if (d, s) in dead]
        for g in orphans:
            prev = routes[g][s - 1] if s > 0 else None
            best = min(live, key=lambda d: (load[d] + per_mb[d], d != prev, load[d], d))
            routes[g][s] = best
            load[best] += per_mb[best]
    return routes


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
