"""Failure-trace simulator: compare recovery policies on the same trace of failures.

Throughput is piecewise constant between events, so the simulation walks the events in
time order and integrates micro-batches trained. Policies:
  recycle        re-route to same-stage peers: the period of the plan for the current
                 failed set; a failure costs the iteration in flight (mini-batch rollback);
                 a stage with no live worker halts until a repair, then restores from the
                 last checkpoint.
  checkpoint     classic restart: any failure stops the job until the worker is repaired,
                 then restarts (restart time) from the last checkpoint.
  drop-replica   elastic data parallelism: a replica with any failed worker is dropped
                 (the global batch shrinks) until all its workers are back.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Iterable

from planner.failures import Worker, dead_stage
from planner.job import JobSpec

POLICIES = ("recycle", "checkpoint", "drop-replica")


@dataclass(frozen=True)
class Event:
    time: float  # seconds
    kind: str  # "fail" | "recover"
    worker: Worker


@dataclass
class Outcome:
    policy: str
    microbatches: float
    stalled_s: float
    lost_iterations: int
    notes: list[str] = field(default_factory=list)


def random_trace(job: JobSpec, duration_s: float, mtbf_s: float, repair_s: float,
                 seed: int = 0) -> list[Event]:
    """Independent exponential failures per worker (mean `mtbf_s`), each repaired after
    `repair_s`. A failed worker does not fail again until repaired."""
    rng = random.Random(seed)
    events = []
    for d in range(job.replicas):
        for s in range(job.stages):
            t = rng.expovariate(1 / mtbf_s)
            while t < duration_s:
                events.append(Event(t, "fail", (d, s)))
                events.append(Event(t + repair_s, "recover", (d, s)))
                t += repair_s + rng.expovariate(1 / mtbf_s)
    return sorted((e for e in events if e.time < duration_s),
                  key=lambda e: (e.time, e.kind != "recover"))


def simulate(job: JobSpec, trace: Iterable[Event], duration_s: float,
             period_of: Callable[[list[Worker]], int], unit_s: float,
             checkpoint_every_s: float = 600.0, restart_s: float = 60.0) -> list[Outcome]:
    """Micro-batches trained by each policy over `duration_s` on the same trace;
    `period_of(failed)` gives the planned period (spec units) for a plannable failed set."""
    trace = sorted(trace, key=lambda e: e.time)
    base = period_of([]) * unit_s
    DM, M = job.num_microbatches, job.microbatches
    return [_run(policy, job, trace, duration_s, period_of, unit_s, base, DM, M,
                 checkpoint_every_s, restart_s) for policy in POLICIES]


def _run(policy, job, trace, duration_s, period_of, unit_s, base, DM, M, ckpt, restart):
    failed: set[Worker] = set()
    out = Outcome(policy, 0.0, 0.0, 0)
    t, halted_until, cache = 0.0, 0.0, {}

    def rate() -> float:  # micro-batches per second in the current state
        if policy == "recycle":
            if dead_stage(job, failed) is not None:
                return 0.0
            key = tuple(sorted(failed))
            if key not in cache:
                cache[key] = period_of(list(key)) * unit_s
            return DM / cache[key]
        if policy == "checkpoint":
            return 0.0 if failed else DM / base
        live_replicas = job.replicas - len({d for d, _ in failed})
        return live_replicas * M / base

    for e in list(trace) + [Event(duration_s, "end", (-1, -1))]:
        start = max(t, halted_until)
        r = rate()
        if e.time > start:
            out.microbatches += r * (e.time - start)
        if r == 0.0:
            out.stalled_s += max(0.0, e.time - t)
        t = max(t, e.time)
        if e.kind == "end":
            break
        before = rate()
        if e.kind == "fail":
            failed.add(e.worker)
        else:
            failed.discard(e.worker)
        after = rate()
        if before > 0.0 and after == 0.0:
            # A full stop: the work since the last checkpoint is lost.
            out.microbatches -= min(out.microbatches, (e.time % ckpt) * before)
        elif before > 0.0 and e.kind == "fail" and policy != "checkpoint":
            # Re-planned around the failure: only the iteration in flight is lost.
            in_flight = DM if policy == "recycle" else M * (job.replicas - len(
                {d for d, _ in failed - {e.worker}}))
            out.microbatches -= min(out.microbatches, float(in_flight))
            out.lost_iterations += 1
        if before == 0.0 and after > 0.0:
            halted_until = e.time + restart
            out.notes.append(f"restarted from checkpoint at {e.time:.0f}s")
    return out
