"""Stragglers as data: quantised speed factors and a run-time detector (docs/design.md section 8).

A worker's speed is relative to its stage's peers: the fastest live worker of a stage is
1.0, a worker that needs twice as long per micro-batch is 0.5. Measured speeds are noisy,
so they are quantised to steps of `STEP` (10%) before they enter a job spec: canonical
failed-set keys then repeat and cached plans are reused. Rule: round to the nearest step,
at least one step (0.1), at most 1.0.

The detector turns per-iteration compute reports (seconds per micro-batch: the worker's
compute time over the micro-batches it ran) into a speed grid, with these guards against flapping:
  - a worker's estimate is the minimum of its last `window` reports: on shared cores noise
    only ever adds time (another process held the core, the cache was cold), so the
    fastest of a few reports is the closest to the worker's real cost, and a hiccup, or
    up to window-1 of them, is ignored. (The median was used first: with 2x hiccups on a
    loaded 2-core machine it marked a nominal peer 0.5 once in a CI run);
  - a nominal worker becomes slow only below `enter` (0.7), a slow one is nominal again
    only above `leave` (0.85): between the two, nothing changes (hysteresis). The bar is
    high because compute times of tiny models on shared cores vary by 20% between peers;
  - a slow worker's level moves only when the estimate, quantised, is two steps from it
    (levels are quantised: the raw estimate of a recovered worker at 0.6 that the plan
    gave one micro-batch where its peers got 2 and 3 read 0.74-0.8 on a loaded CI
    machine -- cold caches after each wait, paid per micro-batch, cost more per
    micro-batch when there are fewer -- and, compared raw, never moved it);
  - reports that name their iteration (the local coordinator's) are compared with the
    stage peers' reports of the same iteration, and the worker's best showing over the
    window is its estimate (see estimates());
  - persistence (`persist`, 1: off): a change is made only once `persist` new iterations
    (reports) in a row asked for it, so a burst of noise must outlast window + persist - 1
    iterations. On a 2-core VM beside two CPU hogs, a worker's CPU time rose by up to 1.6x
    for 3-4 iterations in a row now and then (the VM's neighbours), and the window of
    unpaired reports alone re-planned 4-8 times in 40-80 iterations; the local
    coordinator pairs and uses persist 3 (persist 2 still re-planned a 2x2 run beside two
    hogs on a busy CI machine, its healthy worker read 0.6-0.7 four iterations in a row;
    a straggler is found two iterations later than with 1).
Seconds per micro-batch barely change when the plan moves micro-batches away from a slow
worker (on shared cores a worker with fewer pays its cold start after each wait over fewer
of them: see the quantised level rule above), so re-planning hardly feeds back. Pure Python: the local
coordinator and the service both run it.
"""
from __future__ import annotations

from collections import defaultdict, deque
from typing import Optional

STEP = 0.1
MAX_SPEED = 100.0  # a spec or an operator may declare a worker faster than nominal
Grid = list[list[float]]


def quantize(speed: float, step: float = STEP, top: float = 1.0) -> float:
    """`top` 1.0 for measured speeds (relative to the stage's fastest worker); MAX_SPEED
    where a faster worker may be declared. Same steps either way."""
    if not speed == speed:  # nan: no information, nominal
        return 1.0
    q = round(round(speed / step) * step, 6)
    return min(top, max(step, q))


def nominal(grid: Optional[Grid]) -> bool:
    return grid is None or all(v == 1.0 for row in grid for v in row)


def with_speeds(job, grid: Optional[Grid]):
    """The job spec with `grid` (quantised) as its speeds; None for all-nominal."""
    q = None if grid is None else [[quantize(v) for v in row] for row in grid]
    return job.model_copy(update={"speed": None if nominal(q) else q})


class SpeedDetector:
    def __init__(self, replicas: int, stages: int, *, window: int = 3, enter: float = 0.7,
                 leave: float = 0.85, step: float = STEP, persist: int = 1):
        if not 0 < enter <= leave <= 1:
            raise ValueError("need 0 < enter <= leave <= 1")
        if persist < 1:
            raise ValueError("need persist >= 1")
        self.D, self.S, self.window, self.persist = replicas, stages, window, persist
        self.enter, self.leave, self.step = enter, leave, step
        self.reports: dict[tuple[int, int], deque] = defaultdict(lambda: deque(maxlen=window))
        self.grid: Grid = [[1.0] * stages for _ in range(replicas)]
        # Reports that name their iteration: stage -> iteration -> replica -> seconds.
        self.by_iteration: dict[int, dict[int, dict[int, float]]] = defaultdict(dict)
        self.fresh: dict[tuple[int, int], int] = defaultdict(int)  # own reports since update()
        self.compared: dict[tuple[int, int], int] = {}  # newest iteration compared with a peer
        self.streak: dict[tuple[int, int], int] = defaultdict(int)  # evidence asking a change

    def observe(self, replica: int, stage: int, seconds_per_microbatch: float,
                iteration: Optional[int] = None) -> None:
        if seconds_per_microbatch > 0:
            self.reports[(replica, stage)].append(float(seconds_per_microbatch))
            self.fresh[(replica, stage)] += 1
            if iteration is not None:
                rows = self.by_iteration[stage]
                rows.setdefault(iteration, {})[replica] = float(seconds_per_microbatch)
                for i in [i for i in rows if i <= iteration - 4 * self.window]:
                    del rows[i]  # older than any window looks

    def forget(self, replica: int, stage: int) -> None:
        """A worker failed or restarted: its history says nothing about the new process."""
        for d in (self.reports, self.fresh, self.compared, self.streak):
            d.pop((replica, stage), None)
        for row in self.by_iteration[stage].values():
            row.pop(replica, None)
        self.grid[replica][stage] = 1.0

    def _ratios(self, replica: int, stage: int) -> list[tuple[int, float]]:
        """(iteration, speed against the fastest stage peer of that same iteration)."""
        return [(i, min(row.values()) / row[replica])
                for i, row in sorted(self.by_iteration.get(stage, {}).items())
                if replica in row and len(row) > 1]

    def estimates(self) -> dict[tuple[int, int], float]:
        """Relative speed of every worker with a full window of reports. With iterations:
        the worker's best showing in its last `window` iterations, each against its peers
        of that iteration: a straggler is slow against them every time, noise (a
        neighbour on its core) comes and goes. On a loaded 2-core VM that was never below
        0.78 in 3 iterations in a row, where the minimum of 3 reports against the peers'
        minimum gave 0.64 (they need not come from the same iterations)."""
        best = {w: min(r) for w, r in self.reports.items() if len(r) == self.window}
        out = {}
        for (d, s), t in best.items():
            if any(d in row for row in self.by_iteration.get(s, {}).values()):
                ratios = [r for _, r in self._ratios(d, s)][-self.window:]
                if len(ratios) == self.window:
                    out[(d, s)] = max(ratios)
                continue
            fastest = min(v for (d2, s2), v in best.items() if s2 == s)
            out[(d, s)] = fastest / t
        return out

    def _evidence(self, d: int, s: int) -> int:
        """New evidence on (d, s) since the last update: with iterations, a newer iteration
        compared with a peer; else its own new reports (a peer's report alone moves the
        estimate, but says nothing new about this worker)."""
        if not any(d in row for row in self.by_iteration.get(s, {}).values()):
            return self.fresh[(d, s)]
        ratios = self._ratios(d, s)
        newest = ratios[-1][0] if ratios else None
        news = newest is not None and newest != self.compared.get((d, s))
        self.compared[(d, s)] = newest
        return int(news)

    def update(self) -> Optional[Grid]:
        """The new speed grid if it changed (publish a plan for it), else None."""
        changed = False
        for (d, s), est in self.estimates().items():
            cur = self.grid[d][s]
            if cur == 1.0:
                new = quantize(est, self.step) if est < self.enter else 1.0
            elif est > self.leave:
                new = 1.0
            elif abs(quantize(est, self.step) - cur) >= 2 * self.step - 1e-9:
                new = quantize(est, self.step)
            else:
                new = cur
            news = self._evidence(d, s)
            self.streak[(d, s)] = self.streak[(d, s)] + news if new != cur else 0
            # persist 1 (off): any change applies at once, also one that a peer's report
            # brought about (the service's detector: its tests count the iterations)
            if new != cur and (self.persist == 1 or self.streak[(d, s)] >= self.persist):
                self.grid[d][s] = new
                self.streak[(d, s)] = 0
                changed = True
        self.fresh.clear()
        return [row[:] for row in self.grid] if changed else None
