"""CP-SAT's --time-limit as a wall-time limit (issue 12, item 14): wall time of one
`solve(..., "cpsat", time_limit=T)` on an instance CP-SAT does not prove optimal in time.

    PYTHONPATH=. python benchmarks/cpsat_wall_limit.py [--out benchmarks/results/cpsat_wall_limit.md]
"""
import argparse
import time

from planner.job import JobSpec
from planner.solvers.backends import SolveOptions, solve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--limits", default="5,10")
    args = ap.parse_args()
    job = JobSpec.uniform(2, 4, 8, capacity=16)  # 4 micro-batches of memory per worker
    rows = ["| time limit (s) | wall (s) | wall / limit | status | period |", "| --- | --- | --- | --- | --- |"]
    for tl in (float(x) for x in args.limits.split(",")):
        t0 = time.monotonic()
        p = solve(job, [(0, 1)], "cpsat", opts=SolveOptions(time_limit=tl))
        wall = time.monotonic() - t0
        rows.append(f"| {tl:g} | {wall:.2f} | {wall / tl:.2f} | {p.solver.status} | {p.metrics.period} |")
        print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":  # importing it (tests/test_benchmark_imports.py) ran both solves
    main()
