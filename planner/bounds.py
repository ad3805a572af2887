"""Lower bounds on the period (staggered) and the makespan (synchronous).

For a worker of stage s that runs n micro-batches, its span (first action to OPT end) is
at least its work plus the idle time it cannot avoid:
  - ramp: its first I needs one micro-batch's round trip through the later stages
    (`chain`); before it only F's can run, at most `min(n, slots)` of them;
  - drain: after its last F, that micro-batch's I is again a round trip away; meanwhile
    only the I and W of the other micro-batches it holds can run.
Ramp and drain idle may overlap, so the larger counts. With `slots` micro-batches of memory,
each held from its F to its W for at least a round trip, the span is also at least the
total hold time divided by the slots.

A second family bounds through a bottleneck worker v of stage s: it runs n_v F's and I's
one at a time (and, short of memory, the W's that make room for its last F's), and its
last I also ends at least a round trip through the later stages after its first F plus
all n_v I's, and after its last F plus one I; its first F
waits for one micro-batch to cross stages r..s-1, and its last
I must travel back to stage r, whose all-reduce waits for it; so stage r's earliest-starting
worker spans at least head + n_v (F + I) + tail + W_r + OPT_r.

Every bound grows with n, so the
best re-routing is the one that minimises the largest span: identical units on workers
with non-decreasing costs, for which assigning one unit at a time to the worker whose cost
grows least is optimal. Any routing, not just ours, is covered. Delays: between stages t
and t+1 every micro-batch pays at least the least delay over pairs of live workers of the
two stages (cross-replica only, when no replica is alive at both).
"""
from __future__ import annotations

from planner.failures import Worker, check_plannable, normalize
from planner.job import JobSpec
from planner.plan import Mode


def _fastest(job: JobSpec, dead: set[Worker], op: str, s: int) -> int:
    return min(job.duration(op, d, s) for d in range(job.replicas) if (d, s) not in dead)


def span_bound(job: JobSpec, d: int, s: int, n: int, chain: int) -> int:
    f, i, w = (job.duration(op, d, s) for op in "FIW")
    opt = job.duration("OPT", d, s)
    if n == 0:
        return 0
    slots = job.slots(s)
    held = n if slots is None else min(n, slots)
    ramp = f + chain - held * f
    drain = chain - (held - 1) * (i + w)
    work = n * (f + i + w) + max(0, ramp, drain)
    if slots is not None:
        work = max(work, -(-n * (f + chain + i + w) // slots))
    return work + opt


def _minmax(job: JobSpec, s: int, live: list[int], cost) -> int:
    """Smallest possible max over live workers d of stage s of cost(d, n_d), the n_d adding
    up to all micro-batches, for costs non-decreasing in n: the least T at which the
    workers can take them all, sum_d max{n : cost(d, n) <= T} >= N. Workers with equal
    durations have equal costs, so they are counted once, times their number, and T is
    found by bisection: a few hundred cost evaluations, not N heap steps per call (0.8 s
    per lower bound at D=64, S=16, M=64 with one straggler)."""
    N = job.num_microbatches
    groups: dict[tuple, list[int]] = {}
    for d in live:
        groups.setdefault(tuple(job.duration(op, d, s) for op in ("F", "I", "W", "OPT")),
                          []).append(d)
    if len(groups) == 1:  # identical workers: the counts differ by at most one
        return cost(live[0], -(-N // len(live)))
    reps = [(ds[0], len(ds)) for ds in groups.values()]

    def takes(d: int, T: int) -> int:  # the most micro-batches d can run within T
        lo, hi = 0, N
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost(d, mid) <= T else (lo, mid - 1)
        return lo

    lo, hi = 0, min(cost(d, N) for d, _ in reps)  # one worker running all is feasible
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(k * takes(d, mid) for d, k in reps) >= N:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _busy_until_last_i(job: JobSpec, d: int, v: int, n: int, chain: int) -> int:
    """Time worker (d, v) needs from its first F's start to its last I's end: every F and
    I, and, when it holds fewer slots than micro-batches, the W's that free room for the
    last F's; nor can it beat one round trip (`chain`: F end to I start through the later
    stages) after its first F, with all its I's still to run, or after its last F."""
    if n == 0:
        return 0
    f, i, w = (job.duration(op, d, v) for op in "FIW")
    slots = job.slots(v)
    forced_w = 0 if slots is None else max(0, n - slots)
    return max(n * (f + i) + forced_w * w, f + chain + n * i, n * f + chain + i)


def _least_hop(job: JobSpec, a: list[int], b: list[int]) -> int:
    """The least delay between a live worker of one stage and one of the next: intra if a
    replica is alive at both, cross if two different replicas can pair up (O(D), not O(D^2))."""
    delays = []
    if set(a) & set(b):
        delays.append(job.p2p.intra)
    if len(a) > 1 or len(b) > 1 or a != b:
        delays.append(job.p2p.cross)
    return min(delays)


def stage_bounds(job: JobSpec, failed: list[Worker]) -> list[int]:
    """Per stage s, a bound on the span of some worker of s: its own busiest-worker bound,
    or a bottleneck bound through a later stage. O(S (D + bisection)): sums over stage
    ranges are prefix sums and the bottleneck maximum a suffix maximum (it was O(S^3):
    12 s at S=1,000)."""
    dead = set(failed)
    S, D = job.stages, job.replicas
    fast = {op: [_fastest(job, dead, op, s) for s in range(S)] for op in "FIW"}
    live = [[d for d in range(D) if (d, s) not in dead] for s in range(S)]
    # hop[t]: the least delay between stages t and t+1 over live pairs; every route
    # crosses that boundary between two live workers, so pays at least this much.
    hop = [_least_hop(job, live[t], live[t + 1]) for t in range(S - 1)]
    # trip[x]: F and I of stages 0..x-1 plus both ways over their hops, so that a round
    # trip through stages r..v-1 (and back) costs trip[v] - trip[r].
    trip = [0] * (S + 1)
    for t in range(S):
        trip[t + 1] = trip[t] + fast["F"][t] + fast["I"][t] + (2 * hop[t] if t < S - 1 else 0)
    # chains[s]: from stage s's F end to its I start, through stages s+1..S-1.
    chains = [trip[S] - trip[s + 1] + (2 * hop[s] if s < S - 1 else 0) for s in range(S)]
    out = [_minmax(job, s, live[s], lambda d, n: span_bound(job, d, s, n, chains[s]))
           for s in range(S)]
    # Through bottleneck v > r: trip[v] - trip[r] + busy[v] + tail[r]; the best v for each
    # r is the suffix maximum of trip[v] + busy[v].
    best_after = None
    for v in range(S - 1, 0, -1):
        busy = _minmax(job, v, live[v], lambda d, n: _busy_until_last_i(job, d, v, n, chains[v]))
        here = trip[v] + busy
        best_after = here if best_after is None else max(best_after, here)
        r = v - 1
        tail = min(job.duration("W", d, r) + job.duration("OPT", d, r) for d in live[r])
        out[r] = max(out[r], best_after - trip[r] + tail)
    return out


def lower_bound(job: JobSpec, failed: list[Worker], mode: Mode = Mode()) -> int:
    failed = normalize(job, failed)
    check_plannable(job, failed)
    per_stage = stage_bounds(job, failed)
    if mode.staggered:
        return max(per_stage)
    dead = set(failed)
    best, head = 0, 0
    for s in range(job.stages):  # a stage cannot start before one F has crossed the earlier ones
        best = max(best, head + per_stage[s])
        head += _fastest(job, dead, "F", s) + job.min_delay
    return best
