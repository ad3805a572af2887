"""How long choosing the shape takes on an event (planner/shapes/choose.py), at 16x8 and at
256x16 (4,096 workers: the service's event path has ~100-200 ms in all there).

Per grid and units (the job's stages, or 4 layers a stage from a profiled `layer_cost`),
an event that takes a node of 8 workers, then one that takes half the workers, from the
job's own shape:
  - cold: the first choice for the job (the family's partitions, the count bounds of every
    shape's job: what a service pays once per job, at registration);
  - warm: the choice on a later event (the family and bounds memoised), on the count bound
    (the service's mode, no planning), best of 5;
  - roles only: choose_roles on the fixed shape for the same live set, which the event
    path pays already; the shape choice's own cost is warm minus this;
  - greedy plan: the schedule of the chosen shape's job for its empty slots (cached plans
    skip it; precompute fills the cache off the event path).
CPU seconds (process time), so other jobs on a shared machine weigh less.

    PYTHONPATH=. python benchmarks/shape_choice.py [--out benchmarks/results/shape_choice.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.control.roles import choose_roles, live_from_failed  # noqa: E402
from planner.job import JobSpec  # noqa: E402
from planner.shapes.choose import ShapeChooser  # noqa: E402
from planner.shapes.shape import _FAMILIES  # noqa: E402
from planner.shapes.units import units_of_job  # noqa: E402
from planner.solvers.backends import solve  # noqa: E402


def job_of(D: int, S: int, M: int, layers: bool) -> JobSpec:
    job = JobSpec.uniform(D, S, M, activation=4, capacity=400)
    upd = {"state_bytes": [2 * 10**9] * S, "bandwidth": 25e3}  # 2 GB a stage, 25 GB/s in us
    if layers:  # a profiled spec: 4 blocks a stage, embedding and head
        upd["layer_cost"] = [3] + [28 // 4 * 4 // 4] * (4 * S - 2) + [10]
    return job.model_copy(update=upd)


def cpu() -> float:
    return time.process_time()


def measure(job: JobSpec, gone: int, horizon: float) -> dict:
    D, S = job.replicas, job.stages
    failed = [(d, s) for d in range(D) for s in range(S) if d * S + s < gone]
    live = live_from_failed(job, failed)
    _FAMILIES.clear()
    from planner.control import count_bounds
    count_bounds._MEMOS.clear()
    t = cpu()
    ch = ShapeChooser(job, units_of_job(job))
    c = ch.choose(ch.fixed, live, horizon)
    cold = cpu() - t
    warm = []
    for k in range(5):  # a later event: another live count, the family memoised
        live2 = dict(live)
        for w in list(live2)[-1 - k:]:
            live2.pop(w)
        t = cpu()
        ch.choose(ch.fixed, live2, horizon)
        warm.append(cpu() - t)
    roles = []
    for _ in range(3):
        t = cpu()
        choose_roles(job, live, horizon)
        roles.append(cpu() - t)
    t = cpu()
    solve(c.shape.job, c.failed, "greedy")
    plan = cpu() - t
    return {"live": len(live), "cold": cold, "warm": min(warm), "roles": min(roles),
            "plan": plan, "stages": c.shape.stages, "changed": c.changed,
            "options": len(c.options), "family": len(ch.family)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/shape_choice.md")
    a = ap.parse_args()
    rows = []
    for D, S, M in ((16, 8, 16), (256, 16, 8)):
        for layers in (False, True):
            job = job_of(D, S, M, layers)
            for gone in (8, D * S // 2):
                r = measure(job, gone, horizon=600e6)  # 10 min to the next event, in us
                r.update(grid=f"{D}x{S}x{M}", units="layers" if layers else "stages", gone=gone)
                rows.append(r)
                print(r, flush=True)
    cmd = "PYTHONPATH=. python benchmarks/shape_choice.py" + (
        "" if len(sys.argv) == 1 else " " + " ".join(sys.argv[1:]))
    load = os.getloadavg()[0]
    out = ["# Choosing the shape on an event", "",
           f"Made by `{cmd}` ({platform.python_version()}, "
           f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores shared with "
           f"other jobs, 1-min load {load:.1f} at the end). CPU milliseconds. Uniform job "
           "(F=10, I=10, W=8, OPT=5), 2 GB of state a stage at 25 GB/s, the horizon 10 "
           "minutes; units: the job's stages (a shape merges at most two), or a profiled "
           "spec's layers (4 a stage). The event takes the first `gone` workers; the choice "
           "starts from the job's own shape. cold: first choice for the job (family and "
           "bounds built); warm: a later event, best of 5; roles: choose_roles on the fixed "
           "shape alone (already on the event path); plan: greedy's schedule for the chosen "
           "shape. benchmarks/shape_choice.py has the details.", "",
           "| grid | units | workers gone | live | shapes (family / weighed) | chosen stages "
           "| cold (ms) | warm (ms) | roles alone (ms) | warm - roles (ms) | greedy plan (ms) |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['grid']} | {r['units']} | {r['gone']} | {r['live']} | "
                   f"{r['family']} / {r['options']} | {r['stages']}"
                   f"{' (changed)' if r['changed'] else ''} | {1e3 * r['cold']:.1f} | "
                   f"{1e3 * r['warm']:.1f} | {1e3 * r['roles']:.1f} | "
                   f"{1e3 * (r['warm'] - r['roles']):.1f} | {1e3 * r['plan']:.0f} |")
    with open(a.out, "w") as fh:
        fh.write("\n".join(out) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
