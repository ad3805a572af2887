"""The --rejoin/--restart schedule of a run: which dead worker comes back when, and which
iteration training holds for it. Pure bookkeeping (no processes, no store, no clock of its
own): the coordinator asks it and carries out the answers.

Each entry is consumed by one death of its worker (the earliest first), so a worker can be
killed and rejoined several times. For --rejoin R:S@I the new process starts only once the
run reaches I (every live worker completed I-1 under the plan that has it failed), so the
iterations in between train re-routed; --restart starts it as soon as its death is in a
plan. Meanwhile iteration I is held (store key `hold`): released on admission, on the new
process's death, or `limit` seconds after its start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from executor.protocol import wkey

Worker = tuple[int, int]


@dataclass
class Rejoin:
    """A due restart of a dead worker (one --rejoin/--restart entry)."""
    iteration: int  # training waits before it until the worker is back
    asap: bool = False  # --restart: once its death is in a plan, not when the run reaches it
    spawned: Optional[float] = None  # monotonic time its new process started
    gone: int = 0  # the incarnation whose death this rejoin serves: only a newer one is back


class RejoinBook:
    def __init__(self, entries: Iterable[tuple], external: bool, limit: float):
        # (r, s, iteration, asap): --rejoin entries, and --restart ones with asap True
        self.entries = sorted(((*k[:3], bool(k[3]) if len(k) > 3 else False) for k in entries),
                              key=lambda k: k[2])
        self.external, self.limit = external, limit
        self.pending: dict[Worker, Rejoin] = {}  # dead workers whose restart is awaited
        self.given_up: set[tuple] = set()  # entries not held for again

    def consume(self, w: Worker, now: float, gone: int = 0) -> Optional[str]:
        """`w`'s process of incarnation `gone` died: take its earliest entry, if any; the
        event line to print."""
        due = [k for k in self.entries if k[:2] == w]
        if not due:
            return None
        self.entries.remove(due[0])
        it, asap = due[0][2], due[0][3]
        if self.external:  # its node's launcher (torchrun) restarts it: only hold for it
            self.pending[w] = Rejoin(it, True, spawned=now, gone=gone)
            return f"training waits before iteration {it} until worker {wkey(w)} is back"
        self.pending[w] = Rejoin(it, asap, gone=gone)
        return (f"worker {wkey(w)} will be restarted "
                + ("as soon as its failure is in a plan" if asap else
                   f"when the run reaches iteration {it}")
                + f" (training waits before iteration {it} until it is back)")

    def drop(self, w: Worker) -> bool:
        """`w` died before it was admitted, or was admitted: nothing to hold for now."""
        return self.pending.pop(w, None) is not None

    def await_failed(self, w: Worker, gone: int = 0) -> bool:
        """Service mode: `w` was declared failed while its process (incarnation `gone`)
        lives on (a stall): its due entry is awaited from now on (started once it exits)."""
        due = [k for k in self.entries if k[:2] == w]
        if due and w not in self.pending and due[0] not in self.given_up:
            self.pending[w] = Rejoin(due[0][2], due[0][3], gone=gone)
            return True
        return False

    def admits(self, w: Worker, named: int, newest: int) -> bool:
        """Does a plan naming incarnation `named` of `w` admit its awaited process, the
        newest one started (`newest`)? Only if that is newer than the one that died: a plan
        made before the death was known still names the dead one, and taking that for the
        admission dropped the hold, so the run went on without the worker (chaos, service:
        a second kill in its stage then left the stage empty and halted the run)."""
        rejoin = self.pending.get(w)
        return rejoin is not None and rejoin.gone < named == newest

    def to_spawn(self, may_return: Callable[[Worker, Rejoin], bool]) -> list[tuple[Worker, Rejoin]]:
        """Pending restarts whose process may start now (`may_return` says so)."""
        return [(w, r) for w, r in self.pending.items()
                if r.spawned is None and may_return(w, r)]

    def expire(self, now: float) -> list[str]:
        """Holds whose process was not admitted within `limit` seconds of its start are
        dropped (training goes on; the worker joins when it can): their event lines."""
        lines = []
        for w, rejoin in list(self.pending.items()):
            if rejoin.spawned is not None and now - rejoin.spawned > self.limit:
                lines.append(f"rejoin of {wkey(w)} not admitted within {self.limit:g} s: "
                             f"no longer holding iteration {rejoin.iteration} for it")
                del self.pending[w]
                self.given_up.update(k for k in self.entries
                                     if k[:2] == w and k[2] == rejoin.iteration)
        return lines

    def hold(self) -> int:
        """The store's `hold` value: 1 + the earliest iteration held, 0 for none."""
        its = [rejoin.iteration for rejoin in self.pending.values()]
        return min(its) + 1 if its else 0
