"""Straggler benchmark (`recycle bench planner --speeds`): period against the lower bound
with slow workers, speed-aware routing against a slow worker keeping its share.

Per job, slow workers in the middle stage s = S // 2: replica 1 (one slow) or replicas 1
and 2 (two slow), at speed 0.5 or 0.8, with no failure or with worker 0:s failed too.
`keep` is the routing before speeds counted (every live worker keeps its own
micro-batches, only a failed worker's move): today's greedy and CP-SAT on it are the
baseline; `greedy` and `cpsat` choose the routing (planner/routing.py).
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Optional

from planner.solvers.backends import SolveOptions, solve
from planner.solvers.cpsat import cpsat_plan
from planner.solvers.greedy import greedy_plan
from planner.job import JobSpec
from planner.routing import speed_routes

JOBS = (("examples/job.json", None), ("uniform", (4, 4, 8)), ("uniform", (8, 8, 8)))


@dataclass
class Row:
    job: str
    D: int
    S: int
    M: int
    slow: str
    factor: float
    failed: str
    bound: int
    keep_greedy: int
    keep_cpsat: Optional[int]
    greedy: int
    cpsat: Optional[int]
    cpsat_status: str
    cpsat_s: Optional[float]


def with_slow(job: JobSpec, cells: list[tuple[int, int]], factor: float) -> JobSpec:
    speed = [[1.0] * job.stages for _ in range(job.replicas)]
    for d, s in cells:
        speed[d][s] = factor
    return JobSpec.model_validate({**job.model_dump(), "speed": speed})


def cases(path: str, dims):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = JobSpec.load(os.path.join(root, path)) if dims is None else JobSpec.uniform(*dims)
    name = path if dims is None else "uniform {}x{}x{}".format(*dims)
    s = base.stages // 2
    for cells in ([(1, s)], [(1, s), (2, s)]):
        for factor in (0.5, 0.8):
            for failed in ([], [(0, s)]):
                yield name, with_slow(base, cells, factor), cells, factor, failed


def bench_row(name, job, cells, factor, failed, opts: Optional[SolveOptions]) -> Row:
    keep = speed_routes(job, failed, "keep")
    g = solve(job, failed, "greedy")
    kg = greedy_plan(job, failed, routes=keep)
    cp = kc = None
    if opts is not None:
        cp = solve(job, failed, "cpsat", opts=opts)
        kc = cpsat_plan(job, failed, time_limit=opts.time_limit, num_workers=opts.num_workers,
                        seed=opts.seed, routes=keep)
    return Row(name, job.replicas, job.stages, job.microbatches,
               " ".join(f"{d}:{s}" for d, s in cells), factor,
               " ".join(f"{d}:{s}" for d, s in failed) or "-", g.metrics.lower_bound,
               kg.metrics.period, kc.metrics.period if kc else None, g.metrics.period,
               cp.metrics.period if cp else None, cp.solver.status if cp else "-",
               cp.solver.wall_s if cp else None)


def run_speeds_bench(out: str, time_limit: float = 5.0, cpsat: bool = True,
                     console=None) -> list[Row]:
    opts = SolveOptions(time_limit=time_limit, num_workers=2, seed=0) if cpsat else None
    rows = []
    started = time.perf_counter()
    if console:
        console.print(HEADER)
    for path, dims in JOBS:
        for case in cases(path, dims):
            rows.append(bench_row(*case, opts))
            if console:
                console.print(_md_row(rows[-1]))
    _write(out, rows, time_limit, cpsat, time.perf_counter() - started)
    if console:
        console.print(f"wrote {out}")
    return rows


HEADER = ("| job | slow | speed | failed | bound | keep greedy | keep cpsat | greedy (gap) "
          "| cpsat (gap, status) | cpsat s |")


def _gap(p, lb) -> str:
    return f"{p / lb - 1:.1%}"


def _md_row(r: Row) -> str:
    kc = str(r.keep_cpsat) if r.keep_cpsat is not None else "-"
    cp = (f"{r.cpsat} ({_gap(r.cpsat, r.bound)}, {r.cpsat_status})"
          if r.cpsat is not None else "-")
    return (f"| {r.job} | {r.slow} | {r.factor:g} | {r.failed} | {r.bound} | {r.keep_greedy} | "
            f"{kc} | {r.greedy} ({_gap(r.greedy, r.bound)}) | {cp} | "
            f"{r.cpsat_s if r.cpsat_s is not None else '-'} |")


def _write(out, rows, time_limit, cpsat, wall):
    cmd = "recycle bench planner --speeds " + (f"--time-limit {time_limit:g}" if cpsat
                                               else "--no-cpsat")
    lines = ["# Planner with stragglers", "",
             f"Made by `{cmd}` on {platform.node() or 'this machine'} "
             f"({platform.processor() or platform.machine()}), {wall:.0f} s in all.", "",
             "Slow workers sit in the middle stage s = S/2 (replica 1, or replicas 1 and 2) at "
             "the given speed; `failed` adds a failure in the same stage. `bound` is the lower "
             "bound of the staggered period (planner/bounds.py), gaps are period / bound - 1. "
             "`keep` columns route as before speeds counted (a slow worker keeps all its own "
             "micro-batches, only failed workers' move): the periods today's back-ends gave. "
             "`uniform DxSxM` is `JobSpec.uniform` (F=10, I=10, W=8, OPT=5, p2p 1/2, "
             "activation 4 of 40).", "", HEADER, "|" + "---|" * 10]
    lines += [_md_row(r) for r in rows]
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
