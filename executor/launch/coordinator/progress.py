"""How far each worker got: the newest iteration it completed and under which plan version,
and the store's `committed` counter (the iteration every live worker completed), which only
the coordinator moves."""
from __future__ import annotations

from typing import Iterable

from executor import protocol as P
from executor.runtime.transport.rendezvous import set_counter

Worker = tuple[int, int]


class Progress:
    def __init__(self, store):
        self.store = store
        self.done: dict[Worker, tuple[int, int]] = {}  # worker -> (iteration, version)
        self.committed = -1
        self.retrained = 0  # iterations trained again after a rollback to a snapshot

    def completed(self, w: Worker, iteration: int, version: int) -> None:
        self.done[w] = (iteration, version)

    def forget(self, w: Worker) -> None:
        """`w` is failed: its old steps say nothing of the plan in force."""
        self.done.pop(w, None)

    def reached(self, live: Iterable[Worker], version: int, iteration: int) -> bool:
        """Every live worker has entered plan `version` and completed `iteration`."""
        return all(self.done.get(x, (-1, -1))[1] >= version
                   and self.done[x][0] >= iteration for x in live)

    def at(self, live: list[Worker], iteration: int, version: int) -> bool:
        """Every live worker reported exactly `iteration` under `version` (the run's end)."""
        return all(self.done.get(w) == (iteration, version) for w in live)

    def commit(self, live: list[Worker], version: int) -> None:
        """Move `committed` to the newest iteration every live worker completed; back, when
        all of them entered a version that rolled back to a snapshot (counted retrained)."""
        vals = [self.done[w][0] for w in live if w in self.done]
        if not vals or len(vals) != len(live):
            return
        low = min(vals)
        if low < self.committed and all(self.done[w][1] == version for w in live):
            self.retrained += self.committed - low
            self.committed = low
            set_counter(self.store, P.COMMITTED, low)
        elif low > self.committed:
            # add the difference: one round trip
            self.store.add(P.COMMITTED, low - self.committed)
            self.committed = low
