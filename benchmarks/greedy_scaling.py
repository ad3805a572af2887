"""Greedy planning time against the number of stages S (issue 12, item 10), for one or two
source trees side by side in one run (each case in a fresh process, the best of --repeat).

  python benchmarks/greedy_scaling.py --before /tmp/recycle-main --out benchmarks/results/greedy_scaling.md

`--before` is a checkout of the planner to compare with (e.g. `git archive <commit> planner
| tar -x -C DIR`); this tree is "after". A case over --limit seconds is recorded as such.
"""
import argparse
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE = """
import time, sys
from planner.job import JobSpec
try:
    from planner.solvers.backends import solve
except ImportError:  # a tree from before the planner/solvers/ sub-package
    import importlib
    solve = importlib.import_module("planner" + ".backends").solve
D, S, M, k = map(int, sys.argv[1:5])
job = JobSpec.uniform(D, S, M)
failed = [(1 % D, S // 2)] if k else []
t = time.perf_counter()
plan = solve(job, failed, "greedy")
print(time.perf_counter() - t, plan.metrics.period)
"""
CASES = [(1, 250, 1, 0), (1, 500, 1, 0), (1, 1000, 1, 0), (1, 2000, 1, 0),
         (2, 1000, 4, 1), (1, 5000, 1, 0), (1, 10000, 1, 0), (64, 16, 64, 1)]


def run(tree: str, case, limit: float, repeat: int):
    best = None
    for _ in range(repeat):
        env = dict(os.environ, PYTHONPATH=tree)
        try:  # cwd: `python -c` puts it first on sys.path, before PYTHONPATH
            r = subprocess.run([sys.executable, "-c", CASE, *map(str, case)], env=env, cwd=tree,
                               capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return None, None
        if r.returncode != 0:
            raise SystemExit(f"{tree} {case}: {r.stderr.strip().splitlines()[-1]}")
        secs, period = r.stdout.split()
        best = (float(secs), int(period)) if best is None else min(best, (float(secs), int(period)))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="planner tree to compare with")
    ap.add_argument("--before-label", default="", help="what --before is, for the table")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks/results/greedy_scaling.md"))
    ap.add_argument("--limit", type=float, default=240.0, help="seconds per case")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    started = time.perf_counter()
    lines = ["# Greedy planning time against S", "",
             f"Made by `python benchmarks/greedy_scaling.py{' --before ' + a.before if a.before else ''}"
             f"{f' --limit {a.limit:g}' if a.limit != 240 else ''}` "
             f"on {platform.node()} ({platform.machine()}, {os.cpu_count()} cores, shared and "
             "noisy), each case in a fresh process: `solve(JobSpec.uniform(D, S, M), failed, "
             "\"greedy\")`, plan object, metrics and lower bound included. k=1: one failure at "
             "(1 % D, S // 2). Over the limit: `>limit`; `not run`: a smaller S was already over it."
             + (f" Before: {a.before_label}." if a.before_label else ""), "",
             "| D | S | M | k | before s | after s | before / after | period (same) |",
             "|---|---|---|---|---|---|---|---|"]
    slow_before = False
    for case in CASES:
        before, skipped = (None, None), False
        if a.before and (slow_before and case[1] > 2000):
            skipped = True  # a smaller S was already over the limit
        elif a.before:
            before = run(a.before, case, a.limit, a.repeat)
            slow_before = slow_before or before[0] is None
        after = run(ROOT, case, a.limit, a.repeat)
        b = (f"{before[0]:.2f}" if before[0] is not None else "not run" if skipped
             else f">{a.limit:g}" if a.before else "-")
        f = f"{after[0]:.2f}" if after[0] is not None else f">{a.limit:g}"
        ratio = f"{before[0] / after[0]:.0f}x" if before[0] and after[0] else "-"
        same = "-" if before[1] is None else ("yes" if before[1] == after[1] else f"no ({before[1]} vs {after[1]})")
        line = f"| {case[0]} | {case[1]} | {case[2]} | {case[3]} | {b} | {f} | {ratio} | {same} |"
        print(line, flush=True)
        lines.append(line)
    lines += ["", f"{time.perf_counter() - started:.0f} s in all."]
    with open(a.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
