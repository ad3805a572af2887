"""The losses a run has collected, per iteration and micro-batch, as the workers report
them: which iterations are complete, their mean loss, and a checkpoint manifest's rows."""
from __future__ import annotations

from typing import Iterator, Optional


class LossBook:
    def __init__(self, microbatches: int, start: int, losses: Optional[dict] = None):
        self.n = microbatches
        self.rows: dict[int, dict[int, float]] = losses or {}  # iteration -> g -> loss
        self.printed = start - 1  # the newest iteration handed out by newly_complete()
        self.full_upto = -1  # every iteration up to this one has all its losses

    def add(self, iteration: int, losses: dict) -> None:
        for g, loss in losses.items():
            self.rows.setdefault(iteration, {})[int(g)] = loss

    def complete(self, i: int) -> bool:
        return len(self.rows.get(i, {})) == self.n

    def complete_through(self) -> int:
        """The newest iteration up to which every iteration has all its losses."""
        while self.complete(self.full_upto + 1):  # losses only grow
            self.full_upto += 1
        return self.full_upto

    def newly_complete(self) -> Iterator[int]:
        """Iterations completed since the last call, in order (for the progress lines)."""
        while self.complete(self.printed + 1):
            self.printed += 1
            yield self.printed

    def loss(self, i: int) -> float:
        row = self.rows[i]
        return sum(float(row[g]) for g in range(self.n)) / self.n

    def upto(self, i: int) -> Optional[list]:
        """Losses of iterations 0..i for a checkpoint's manifest, None while any is missing."""
        if any(len(self.rows.get(j, {})) < self.n for j in range(i + 1)):
            return None
        return [[self.rows[j][g] for g in range(self.n)] for j in range(i + 1)]

    def counts(self, iterations: int) -> list[int]:
        return [len(self.rows.get(i, {})) for i in range(iterations)]
