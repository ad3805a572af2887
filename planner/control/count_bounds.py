"""The bound on counts (docs/planner.md, "Roles"): a proven lower bound on the period of
any plan whose stages have given numbers of live workers, whichever slots they fill, and
the counts of n workers that minimise it. Pure; memoised per job (the last 128 jobs), so
the service's event path pays for a job's bounds once, not per event."""
from __future__ import annotations

import heapq
from collections import Counter
from typing import Optional

from planner.bounds import span_bound
from planner.errors import Unplannable
from planner.job import JobSpec


class NoRolesError(Unplannable):
    """Fewer live workers than stages: no assignment serves every stage."""


def _chains(job: JobSpec) -> list[int]:
    """Per stage, the least round trip from its F's end to its I's start through the later
    stages, at the fastest durations and the least delay: no filled-slot set does better."""
    memo = _memo(job)
    if "chains" not in memo:
        memo["chains"] = _chains_of(job)
    return memo["chains"]


def _chains_of(job: JobSpec) -> list[int]:
    S = job.stages
    fast = {op: [min(job.duration(op, d, s) for d in range(job.replicas)) for s in range(S)]
            for op in "FI"}
    hop = job.min_delay
    out, acc = [0] * S, 0
    for s in range(S - 1, -1, -1):
        out[s] = acc
        acc += fast["F"][s] + fast["I"][s] + 2 * hop
    return out


# per-job memos of the per-stage bounds, for the last few jobs: a shape choice
# (planner/shapes/choose.py) reads the bounds of every shape's job on each event
_MEMOS: dict[int, dict] = {}
_KEEP = 128


def _memo(job: JobSpec) -> dict:
    memo = _MEMOS.get(id(job))
    if memo is None or memo["job"] is not job:  # the job itself is kept: its id is not reused
        if len(_MEMOS) >= _KEEP:
            _MEMOS.pop(next(iter(_MEMOS)))
        memo = _MEMOS[id(job)] = {"job": job}
    return memo


def stage_count_bound(job: JobSpec, stage: int, count: int, chain: Optional[int] = None) -> int:
    """No worker of `stage` spans less when `count` workers share its D*M micro-batches:
    one of them runs at least ceil(D*M / count) (planner/bounds.py's span bound, at the
    fastest durations any replica of the stage has)."""
    if count <= 0:
        return 2**62
    memo = _memo(job)
    if chain is None:
        chain = _chains(job)[stage]
    key = (stage, count, chain)
    if key not in memo:
        n = -(-job.num_microbatches // count)
        fastest = memo.get(("fastest", stage))
        if fastest is None:
            fastest = memo[("fastest", stage)] = min(
                range(job.replicas),
                key=lambda d: sum(job.duration(op, d, stage) for op in ("F", "I", "W", "OPT")))
        memo[key] = span_bound(job, fastest, stage, n, chain)
    return memo[key]


def count_bound(job: JobSpec, counts: list[int]) -> int:
    """A lower bound on the period of every plan whose stage s has counts[s] live workers,
    whichever slots they fill and whoever fills them (section "Roles" of docs/planner.md)."""
    chains = _chains(job)
    return max(stage_count_bound(job, s, c, chains[s]) for s, c in enumerate(counts))


def best_counts(job: JobSpec, n: int, chains: Optional[list[int]] = None) -> list[int]:
    """Counts of n workers (each stage at least 1, at most D) with the least count_bound:
    one worker at a time to the stage whose bound is highest (ties: the lower stage). The
    per-stage bounds do not grow with the count, so this min-max is optimal. (`chains`:
    the round trips the bound counts; zeros give the counts that balance the stages' work
    alone.) The counts of n are those of n - 1 plus one step, so the steps are found once
    per job (a heap: 4,000 steps at 256 x 16) and every n counts a prefix of them."""
    S, D = job.stages, job.replicas
    if n < S:
        raise NoRolesError(f"{n} live workers cannot serve {S} stages")
    chains = _chains(job) if chains is None else chains
    steps = _greedy_steps(job, tuple(chains))
    counts = [1] * S
    for s, k in Counter(steps[:min(n, S * D) - S]).items():  # C speed: 4,000 steps in 0.1 ms
        counts[s] += k
    return counts


def _greedy_steps(job: JobSpec, chains: tuple) -> list[int]:
    """The stage each greedy step of best_counts adds a worker to, from n = S to S * D."""
    memo = _memo(job)
    key = ("steps", chains)
    if key not in memo:
        S, D = job.stages, job.replicas
        counts, steps = [1] * S, []
        heap = [(-stage_count_bound(job, s, 1, chains[s]), s) for s in range(S) if D > 1]
        heapq.heapify(heap)
        while heap:
            _, s = heapq.heappop(heap)
            counts[s] += 1
            steps.append(s)
            if counts[s] < D:
                heapq.heappush(heap, (-stage_count_bound(job, s, counts[s], chains[s]), s))
        memo[key] = steps
    return memo[key]


def need_count(job: JobSpec, stage: int, bound: int, chain: int) -> int:
    """The fewest workers (at most D) that bring `stage`'s count bound to `bound` or below:
    a bisection, the bound not growing with the count."""
    lo, hi = 1, job.replicas
    while lo < hi:
        mid = (lo + hi) // 2
        if stage_count_bound(job, stage, mid, chain) > bound:
            lo = mid + 1
        else:
            hi = mid
    return lo


def elastic_bound(job: JobSpec, n: int) -> int:
    """No plan on n live workers, whatever their roles, has a shorter period."""
    return count_bound(job, best_counts(job, n))
