"""The scheduling model of docs/design.md section 4 as flat arrays, shared by the exact back-ends.

`Actions` enumerates every F/I/W (or F/B) of fixed routes with its worker, duration,
chain predecessor and delay, in a deterministic order, so that CP-SAT and the MILP build
the same model and read solutions back the same way. It also holds what both solvers use
to prune: earliest starts, tails (shortest time from an action's start to the end of its
stage's OPT), and the symmetry groups of interchangeable micro-batches.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from planner.failures import Worker
from planner.job import JobSpec
from planner.solvers.timeline import Mode, Timeline


@dataclass
class Actions:
    ops: list[str] = field(default_factory=list)
    stage: list[int] = field(default_factory=list)
    mb: list[int] = field(default_factory=list)
    worker: list[Worker] = field(default_factory=list)
    dur: list[int] = field(default_factory=list)
    # (pred, lag): this action starts at least `lag` after pred starts (pred's duration
    # plus the p2p delay); chain heads have pred -1.
    pred: list[int] = field(default_factory=list)
    lag: list[int] = field(default_factory=list)
    index: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (op, s, g) -> i
    on: dict[Worker, list[int]] = field(default_factory=dict)  # worker -> its actions
    es: list[int] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)
    back: str = "I"  # the op that ends the backward chain step: I (split) or B (fused)
    release: str = "W"  # the op whose end frees a micro-batch's activation: W or B

    def __len__(self) -> int:
        return len(self.ops)


def build_actions(job: JobSpec, routes: list[list[int]], mode: Mode) -> Actions:
    S = job.stages
    a = Actions(back="I" if mode.split_backward else "B",
                release="W" if mode.split_backward else "B")
    on: dict[Worker, list[int]] = defaultdict(list)
    opt_max = [max((job.duration("OPT", d, s) for d in set(r[s] for r in routes)), default=0)
               for s in range(S)]

    def add(op, s, g, pred, lag):
        d = routes[g][s]
        i = len(a.ops)
        a.ops.append(op); a.stage.append(s); a.mb.append(g); a.worker.append((d, s))
        a.dur.append(job.duration(op, d, s)); a.pred.append(pred); a.lag.append(lag)
        a.index[(op, s, g)] = i
        on[(d, s)].append(i)
        a.es.append(0 if pred < 0 else a.es[pred] + lag)
        return i

    for g, row in enumerate(routes):
        prev = -1
        for s in range(S):  # forward chain
            lag = 0 if prev < 0 else a.dur[prev] + job.delay(row[s - 1], row[s])
            prev = add("F", s, g, prev, lag)
        for s in reversed(range(S)):  # backward chain, W hanging off each I
            lag = a.dur[prev] + (job.delay(row[s + 1], row[s]) if s < S - 1 else 0)
            prev = add(a.back, s, g, prev, lag)
            if mode.split_backward:
                add("W", s, g, prev, a.dur[prev])
    # Tails, computed backwards over the chains (every successor has a larger index).
    n = len(a.ops)
    a.tail = [0] * n
    for i in range(n):
        if a.ops[i] == a.release:
            a.tail[i] = a.dur[i] + opt_max[a.stage[i]]
    for i in reversed(range(n)):
        p = a.pred[i]
        if p >= 0:
            a.tail[p] = max(a.tail[p], a.lag[i] + a.tail[i])
    a.on = {k: on[k] for k in sorted(on)}
    return a


def symmetry_chains(job: JobSpec, routes: list[list[int]], acts: Actions) -> list[list[int]]:
    """Chains of actions that may be fixed in index order: the same (op, stage) of the
    micro-batches of one replica that follow the same route. Relabelling those micro-batches
    so that, at every (op, stage), the k-th earliest belongs to the k-th of them keeps every
    constraint (equal durations and delays; memory counts only starts and ends), so some
    optimal plan satisfies the order."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for g, row in enumerate(routes):
        groups[(job.owner(g), tuple(row))].append(g)
    chains = []
    ops = ("F", "I", "W") if acts.back == "I" else ("F", "B")
    for key in sorted(groups):
        gs = groups[key]
        if len(gs) < 2:
            continue
        for s in range(job.stages):
            for op in ops:
                chains.append([acts.index[(op, s, g)] for g in gs])
    return chains


def canonical_starts(acts: Actions, chains: list[list[int]], starts: list[int]) -> list[int]:
    """The relabelling of `symmetry_chains`: sort the starts along every chain, so a
    solution (e.g. the greedy hint) satisfies the symmetry-breaking order."""
    out = list(starts)
    for ch in chains:
        for i, t in zip(ch, sorted(out[i] for i in ch)):
            out[i] = t
    return out


def starts_of(acts: Actions, timeline: Timeline) -> list[int]:
    starts = [0] * len(acts)
    for (d, s), lst in timeline.items():
        for op, g, st, _ in lst:
            if op != "OPT":
                starts[acts.index[(op, s, g)]] = st
    return starts


def timeline_of(acts: Actions, starts: list[int]) -> Timeline:
    tl: Timeline = {}
    for w, idx in acts.on.items():
        tl[w] = sorted(((acts.ops[i], acts.mb[i], starts[i], starts[i] + acts.dur[i])
                        for i in idx), key=lambda a: (a[2], a[3]))
    return tl


def period_horizon(job: JobSpec, acts: Actions, period: int) -> int:
    """Latest finish any period-optimal plan needs, once shifted to start at 0. Every
    worker's actions and OPT lie in a window of length <= period; workers of one stage share
    the OPT start, and a micro-batch's F and I on adjacent stages tie those workers' windows
    to within one period of each other. Windows are thus chained from the earliest one, at
    most one period per worker."""
    return (len(acts.on) + 1) * period


def slots_needed(job: JobSpec, acts: Actions) -> dict[Worker, Optional[int]]:
    """Memory slots per worker where the capacity can bind (fewer slots than micro-batches)."""
    out = {}
    for w, idx in acts.on.items():
        cap = job.slots(w[1])
        n = sum(1 for i in idx if acts.ops[i] == "F")
        out[w] = cap if cap is not None and cap < n else None
    return out
