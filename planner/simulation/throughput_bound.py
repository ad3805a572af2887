"""An upper bound on the rate any layout of n live workers reaches: the `limit`'s rate.

Any layout: pipelines of any depth, equal or not, any number of replicas, re-routed or not,
each stage any contiguous run of the model's units that fits a worker's memory. The bound
is a relaxation of every such layout's steady state, not the best of a family:

  A worker of a stage with work w (F+I+W of its units, per micro-batch) and optimizer step
  o runs, every period P, its micro-batches' work and its step: P >= m_v * w + o for its
  m_v micro-batches. Summed over the c workers of the stage, c >= m * w / (P - o) for the
  stage's m micro-batches. A group of workers that serves m micro-batches through a cut X
  (stages j) so holds at least m * g_X(P) workers, g_X(P) = sum_j w_j / (P - o_j), and at
  least one per stage. Any layout is groups, each with its own cut and share m_g of the
  D*M micro-batches of an iteration, so it holds n >= sum_g m_g g_Xg(P) >= D*M * g(P), g
  the least g_X over the cuts of at most n stages. The least P with D*M * g(P) <= n bounds
  every layout's period from below.

What it leaves out (the relaxation, so the bound is never below a real layout): pipeline
bubbles (fill and drain), p2p latency, whole workers and whole micro-batches (a stage's
share is spread evenly over fractional workers), stragglers (every worker at nominal
speed). The memory rule is the planner's: a stage holds its units' parameters and one
micro-batch's activations (and, for a spec without parameter sizes, at most two of its
stages).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from planner.shapes.units import Unit


class ThroughputBound:
    """The least period (in the units' time unit) n workers could reach; memoised per n."""

    def __init__(self, units: Sequence[Unit], microbatches: int, capacity: Optional[int]):
        self.units, self.DM, self.capacity = tuple(units), microbatches, capacity
        L = len(self.units)
        # every stage a worker can hold: [a, b) -> (work, step); None where it does not fit
        self.stages: dict[tuple[int, int], tuple[int, int]] = {}
        # a spec's units are its stages, with no parameter memory: a worker is taken to
        # hold at most two of them, as the planner takes it (planner/shapes/units.py)
        longest = L if any(u.params for u in self.units) else 2
        for a in range(L):
            work = step = mem = 0
            for b in range(a + 1, min(L, a + longest) + 1):
                u = self.units[b - 1]
                work, step = work + u.F + u.I + u.W, step + u.OPT
                mem += u.params + u.activation
                if capacity is not None and mem > capacity:
                    break  # a longer run of units holds at least as much
                self.stages[(a, b)] = (work, step)
        self._memo: dict[int, Optional[float]] = {}

    def workers_needed(self, period: float, max_stages: int) -> float:
        """D*M * g(P): the fewest workers (fractional within a stage) any cut of at most
        `max_stages` stages needs to serve every micro-batch within `period`."""
        L = len(self.units)
        S = min(max_stages, L)
        if S == L:  # no cut has more stages than units: the count binds nothing
            best = [0.0] + [math.inf] * L
            for (a, b), (work, step) in self.stages.items():  # a < b: best[a] is final
                if best[a] < math.inf and period > step:
                    best[b] = min(best[b], best[a] + work / (period - step))
            return self.DM * best[L]
        # need[s][b]: the least sum of w / (P - o) over cuts of units [0, b) into s stages
        need = [[math.inf] * (L + 1) for _ in range(S + 1)]
        need[0][0] = 0.0
        for s in range(1, S + 1):
            prev, row = need[s - 1], need[s]
            for (a, b), (work, step) in self.stages.items():
                if prev[a] < math.inf and period > step:
                    row[b] = min(row[b], prev[a] + work / (period - step))
        return self.DM * min(need[s][L] for s in range(S + 1))

    def period(self, n: int) -> Optional[float]:
        """The least period at which n workers could train an iteration (None: no cut of
        the units fits in n workers, so nothing trains)."""
        if n not in self._memo:
            self._memo[n] = self._period(n)
        return self._memo[n]

    def _period(self, n: int) -> Optional[float]:
        if n <= 0 or self.workers_needed(math.inf, n) == math.inf:
            return None  # no cut of at most n stages fits the workers' memory
        total = sum(u.F + u.I + u.W for u in self.units)
        lo = self.DM * total / n  # the work alone, spread over every worker: never enough
        hi = max(lo, 1.0) * 2
        while self.workers_needed(hi, n) > n:
            hi *= 2
        for _ in range(60):  # to a relative 1e-12 or so: the bisection is the answer
            mid = (lo + hi) / 2
            if self.workers_needed(mid, n) <= n:
                hi = mid
            else:
                lo = mid
            if hi - lo <= hi * 1e-12:
                break
        return hi
