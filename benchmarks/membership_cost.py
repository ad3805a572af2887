"""What elastic membership costs the service per failure event: the membership transition
(planner/control/membership.py) of a single failure, and of its recovery, with the job
given (elastic: roles chosen by planner/control/elastic.py, as api/ runs it, at the
service's default horizon) and without (the plain failed set, as before roles), side by
side in one run (A/B interleaved per event: the machine is shared). Also how many of the
decisions moved a worker to another stage (free moves: the spec has no state_bytes).

    PYTHONPATH=. .venv/bin/python benchmarks/membership_cost.py [--events 20] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from api.jobs.runtime import ServiceConfig
from planner.control.membership import Membership, Publish
from planner.job import JobSpec

GRIDS = ((16, 8, 4), (64, 16, 4), (256, 16, 4))


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1000


def run(D: int, S: int, M: int, events: int, seed: int) -> dict:
    spec = JobSpec.uniform(D, S, M)
    members = {
        "elastic": Membership.start(D, S, **ServiceConfig().elastic(spec)).with_speeds(None),
        "plain": Membership.start(D, S),
        # `?shape=speed`: the shape chooser at every failure and return
        "speed": Membership.start(D, S, **ServiceConfig().elastic(spec, "speed")
                                  ).with_speeds(None)}
    rng = random.Random(seed)
    ms: dict = {k: [] for k in members}
    moved = cut = 0
    for i in range(events):
        w = (rng.randrange(D), rng.randrange(S))
        order = list(members)[i % 3:] + list(members)[:i % 3]  # interleaved
        for kind in order:
            m = members[kind]
            (m1, d), t1 = timed(m.fail, w)
            (m2, _), t2 = timed(m1.recover, w)
            ms[kind] += [t1, t2]
            if kind == "elastic" and isinstance(d, Publish) and d.moves:
                moved += 1
            if kind == "speed" and isinstance(d, Publish) and d.partition is not None:
                cut += 1
    ms["roles"] = in_force(members["elastic"], rng, events)
    return {"grid": f"{D}x{S}x{M}", "events": events, "moved": moved, "cut": cut,
            **{k: (statistics.median(v), sorted(v)[int(0.9 * (len(v) - 1))])
               for k, v in ms.items()}}


def in_force(m: Membership, rng: random.Random, events: int) -> list[float]:
    """ms per transition of a membership whose plan in force has roles (a worker moved:
    every later transition carries them): failures of random workers until a version
    moves someone, then `events` failures, each followed by its recovery, on it."""
    for _ in range(m.replicas * m.stages):
        w = (rng.randrange(m.replicas), rng.randrange(m.stages))
        if w not in m.failed:
            m1, d = m.fail(w)
            if isinstance(d, Publish):  # a halt (a stage emptied) is skipped
                m = m1.entered(m1.version)
        if m.roles is not None:
            break
    out = []
    while len(out) < 2 * events:
        w = (rng.randrange(m.replicas), rng.randrange(m.stages))
        if w in m.failed:
            continue
        (m1, d), t1 = timed(m.fail, w)
        if not isinstance(d, Publish):
            continue
        (_, _), t2 = timed(m1.entered(m1.version).recover, w)
        out += [t1, t2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/membership_cost.md")
    args = ap.parse_args()
    rows = []
    for D, S, M in GRIDS:
        r = run(D, S, M, args.events, args.seed)
        rows.append(r)
        print(f"{r['grid']}: elastic median {r['elastic'][0]:.1f} ms (p90 {r['elastic'][1]:.1f}), "
              f"plain {r['plain'][0]:.3f} ms (p90 {r['plain'][1]:.3f}); roles in force "
              f"{r['roles'][0]:.1f} ms (p90 {r['roles'][1]:.1f}); speed "
              f"{r['speed'][0]:.1f} ms (p90 {r['speed'][1]:.1f}), {r['cut']} cut; "
              f"{r['moved']}/{r['events']} failures moved a worker", flush=True)
    cmd = "PYTHONPATH=. python benchmarks/membership_cost.py " + " ".join(sys.argv[1:])
    lines = [
        "# Elastic membership: the service's cost per failure event",
        "",
        f"Made by `{cmd.strip()}` (Python {platform.python_version()}, "
        f"{datetime.date.today()}, a shared 2-core machine). Per grid, {args.events} single "
        "failures of random workers (seeded), each followed by its recovery: the membership "
        "transition alone (planner/control/membership.py `fail`, `recover`), with the job "
        "given (elastic, the service's default horizon of 1000 failure-free periods; the "
        "spec has no state_bytes, so moves are free) and without (the plain failed set), "
        "A/B interleaved per event. ms per transition, median and p90 over failures and "
        "recoveries; `moved`: failures whose version moves a worker to another stage; "
        "`roles in force`: the same on a membership whose plan has roles (random failures "
        "until one moved a worker, then as many failures and recoveries on it); `speed`: a "
        "job registered with `?shape=speed`, the shape chooser (planner/shapes/choose.py) "
        "at every failure and return, and `cut`: failures whose version changed the shape "
        "(the count bound stands in for planned periods above 256 workers, as on the "
        "service).",
        "",
        "| grid | elastic ms (median / p90) | plain ms (median / p90) | moved | "
        "roles in force ms (median / p90) | speed ms (median / p90) | cut |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['grid']} | {r['elastic'][0]:.1f} / {r['elastic'][1]:.1f} | "
                     f"{r['plain'][0]:.3f} / {r['plain'][1]:.3f} | {r['moved']} / {r['events']} | "
                     f"{r['roles'][0]:.1f} / {r['roles'][1]:.1f} | "
                     f"{r['speed'][0]:.1f} / {r['speed'][1]:.1f} | {r['cut']} / {r['events']} |")
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""
    notes = old[old.index("\n## Notes"):] if "\n## Notes" in old else ""  # kept by hand
    out.write_text("\n".join(lines) + "\n" + notes)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
