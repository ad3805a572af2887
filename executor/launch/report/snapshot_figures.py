"""What the run's peer-memory snapshots were (--snapshot-every): K as chosen (auto) or given,
why, and the host memory they held at the end; printed once K is known and put in the
summary (`elastic.snapshot_every`, `elastic.snapshot_mib_per_worker`)."""
from __future__ import annotations

from typing import Callable, Optional

from executor.runtime.peer_snapshots.cadence import EVERY_KEY, Choice, every_text


class SnapshotFigures:
    def __init__(self, every: int, say: Callable[[str], None]):
        self.asked = every  # AUTO, 0 (off) or K
        self.choice: Optional[Choice] = (None if every < 0 else
                                         Choice(every, "off" if every == 0 else "fixed"))
        self.say = say
        self.bytes: dict = {}  # worker -> bytes its snapshots held at its last step
        self.log_bytes: dict = {}  # worker -> the most its boundary log held

    def look(self, store) -> None:
        """Once per worker message until auto's choice is in the store (one key check)."""
        if self.choice is None and store.check([EVERY_KEY]):
            self.choice = Choice.from_json(store.get(EVERY_KEY))
            self.say(f"peer-memory snapshots every {self.choice.every} iterations "
                     f"({self.choice.why})" if self.choice.every else
                     f"peer-memory snapshots {self.choice.why}")

    def final(self, w, every, nbytes: int, log_bytes=None) -> None:
        self.bytes[w] = nbytes
        if log_bytes is not None:
            self.log_bytes[w] = log_bytes
        if self.choice is None and every is not None:
            self.choice = Choice(every, "auto")

    def report(self) -> dict:
        """For the service's progress (its live page): K once known, the memory at the end."""
        out = {}
        if self.choice is not None:
            out["snapshot_every"] = self.choice.every
        if self.bytes:
            out["snapshot_mib"] = round(max(self.bytes.values()) / 2 ** 20, 3)
        return out

    def counts(self) -> dict:
        every = self.choice.every if self.choice is not None else None
        held = max(self.bytes.values(), default=0)
        return {"snapshot_every": every_text(self.asked) if every is None else every,
                "snapshot_mib_per_worker": round(held / 2 ** 20, 3),
                "log_mib_per_worker": round(max(self.log_bytes.values(), default=0) / 2 ** 20, 3)}
