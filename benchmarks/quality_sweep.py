"""Plan quality sweep: period / lower bound of greedy (and optionally CP-SAT) per size.

Jobs: JobSpec.uniform(D, S, M) for D in {2,4,8,16}, S in {4,8}, M in {8,16,32}, failed set
planner.bench.quality.failure_set(D, S, k) for k in {0,1,2}. Prints one row per job, then the worst
and mean gap per back-end and the worst cases.
Usage: PYTHONPATH=. python benchmarks/quality_sweep.py [--cpsat] [--time-limit 10]
       [--cpsat-max-actions 3500] [--D 2,4] [--S 8] [--M 8,16] [--k 0,1,2]
"""
from __future__ import annotations

import argparse
import itertools
import time

from planner.solvers.backends import SolveOptions, solve
from planner.bench.quality import failure_set
from planner.job import JobSpec
from planner.validate import check


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpsat", action="store_true")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--cpsat-max-actions", type=int, default=3500)
    ap.add_argument("--D", type=_ints, default=[2, 4, 8, 16])
    ap.add_argument("--S", type=_ints, default=[4, 8])
    ap.add_argument("--M", type=_ints, default=[8, 16, 32])
    ap.add_argument("--k", type=_ints, default=[0, 1, 2])
    ap.add_argument("--worst", type=int, default=8)
    args = ap.parse_args()
    opts = SolveOptions(time_limit=args.time_limit, num_workers=2, seed=0)
    gaps: dict[str, list] = {"greedy": [], "cpsat": []}
    print(f"{'D':>2} {'S':>2} {'M':>3} {'k':>1} {'actions':>7} {'lb':>5} {'greedy':>6} "
          f"{'gap%':>6} {'ms':>7} {'cpsat':>6} {'gap%':>6} {'status':>9} {'s':>6}")
    for D, S, M, k in itertools.product(args.D, args.S, args.M, args.k):
        job, failed = JobSpec.uniform(D, S, M), failure_set(D, S, k)
        n = 3 * D * S * M
        t = time.perf_counter()
        g = check(solve(job, failed, "greedy"))
        ms = (time.perf_counter() - t) * 1e3
        lb = g.metrics.lower_bound
        gg = g.metrics.period / lb - 1
        gaps["greedy"].append((gg, D, S, M, k))
        line = (f"{D:>2} {S:>2} {M:>3} {k:>1} {n:>7} {lb:>5} {g.metrics.period:>6} "
                f"{100 * gg:>6.2f} {ms:>7.1f}")
        if args.cpsat and n <= args.cpsat_max_actions:
            c = check(solve(job, failed, "cpsat", opts=opts))
            cg = c.metrics.period / lb - 1
            gaps["cpsat"].append((cg, D, S, M, k))
            line += (f" {c.metrics.period:>6} {100 * cg:>6.2f} {c.solver.status:>9} "
                     f"{c.solver.wall_s:>6.2f}")
        print(line, flush=True)
    for name, rows in gaps.items():
        if not rows:
            continue
        print(f"\n{name}: worst {100 * max(rows)[0]:.2f}%  mean "
              f"{100 * sum(r[0] for r in rows) / len(rows):.2f}%  over {len(rows)} jobs")
        for S in sorted({r[2] for r in rows}):
            sub = [r[0] for r in rows if r[2] == S]
            print(f"  S={S}: worst {100 * max(sub):.2f}%  mean {100 * sum(sub) / len(sub):.2f}%")
        for gap, D, S, M, k in sorted(rows, reverse=True)[:args.worst]:
            print(f"  D={D} S={S} M={M} k={k}: {100 * gap:.2f}%")


if __name__ == "__main__":
    main()
