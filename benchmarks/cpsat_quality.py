"""CP-SAT plan quality against greedy and the lower bound on uniform jobs.

For D in {2,4,8}, S in {4,8}, M in {8,16}, with no failure and with worker (0, 1) failed:
status, period / lower bound for cpsat and greedy, cpsat wall time, number of actions.
Usage: PYTHONPATH=. python benchmarks/cpsat_quality.py [--time-limit 10] [--workers 2]
"""
from __future__ import annotations

import argparse
import itertools
import time

from planner.solvers.cpsat import cpsat_plan
from planner.solvers.greedy import greedy_plan
from planner.job import JobSpec
from planner.plan import Mode
from planner.validate import check


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sync", action="store_true", help="synchronous optimizer (makespan)")
    args = ap.parse_args()
    mode = Mode(staggered=not args.sync)
    print(f"mode={mode.optimizer} time_limit={args.time_limit}s workers={args.workers}")
    print(f"{'D':>2} {'S':>2} {'M':>3} {'fail':>4} {'actions':>7} {'status':>9} {'cpsat/lb':>8} "
          f"{'greedy/lb':>9} {'period':>6} {'greedy':>6} {'lb':>5} {'wall_s':>6} {'greedy_s':>8}")
    for D, S, M in itertools.product((2, 4, 8), (4, 8), (8, 16)):
        job = JobSpec.uniform(D, S, M)
        for failed in ([], [(0, 1)]):
            t = time.perf_counter()
            g = greedy_plan(job, failed, mode)
            g_s = time.perf_counter() - t
            p = check(cpsat_plan(job, failed, mode, time_limit=args.time_limit,
                                 num_workers=args.workers))
            lb = p.metrics.lower_bound
            print(f"{D:>2} {S:>2} {M:>3} {len(failed):>4} {3 * D * S * M:>7} "
                  f"{p.solver.status:>9} {p.metrics.period / lb:>8.3f} "
                  f"{g.metrics.period / lb:>9.3f} {p.metrics.period:>6} {g.metrics.period:>6} "
                  f"{lb:>5} {p.solver.wall_s:>6.2f} {g_s:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
