"""Bringing dead workers back (local processes, or torchrun's restarts): when a due
--rejoin/--restart starts its new process, which iteration training holds for it, when
the plan admitting it is published, and how long a paused run waits for them (rejoins.py
keeps the schedule; planner/control/membership.py decides the plan)."""
from __future__ import annotations

import time
from typing import Optional

from executor.launch.rejoins import Rejoin
from executor import protocol as P
from executor.protocol import wkey
from executor.runtime.rendezvous import set_counter

Worker = tuple[int, int]


class Admission:
    """Mixed into the Coordinator (launcher.py): its processes, store, plan and members."""

    def restart(self, w: Worker) -> None:
        """Consume the earliest --rejoin/--restart of `w`, if any (one entry per death);
        the process starts later, in spawn_due()."""
        line = self.rejoins.consume(w, time.monotonic(), self.members.incarnation(w))
        if line is not None:
            self.event(line)
            self.update_hold()

    def returning(self, w: Worker, rejoin: Rejoin) -> bool:
        """May `w`'s next process start now? Only once the plan in force has `w` failed
        (its death is a failure event first) and its old process has exited; for --rejoin,
        also once every live worker has completed the iteration before the rejoin's under
        that plan, so the iterations in between train re-routed, every time. A paused run
        trains no iteration until workers are back: its rejoins start at once."""
        p = self.procs.get(w)
        if (w not in self.failed and w not in self.reported) or (
                p is not None and p.exitcode is None):
            return False
        return rejoin.asap or self.paused_since is not None or self.reached(rejoin.iteration - 1)

    def reached(self, iteration: int) -> bool:
        """Every live worker has entered the plan in force and completed `iteration`."""
        return all(self.done.get(x, (-1, -1))[1] >= self.version
                   and self.done[x][0] >= iteration for x in self.live())

    def spawn_due(self) -> None:
        for w, rejoin in self.rejoins.to_spawn(self.returning):
            self.event(f"restarting worker {wkey(w)} to rejoin at iteration {rejoin.iteration}")
            self.spawn(w)
            rejoin.spawned = time.monotonic()
            self.record.restarts_at.append((time.time(), w, rejoin.iteration))

    def admitted(self, w: Worker) -> None:
        if self.rejoins.drop(w):
            self.update_hold()

    def update_hold(self) -> None:
        """Workers wait before the earliest iteration a pending rejoin is due at."""
        for line in self.rejoins.expire(time.monotonic()):
            self.event(line)
        set_counter(self.store, P.HOLD, self.rejoins.hold())

    def admit(self, w: Worker, inc: int) -> None:
        """Publish the plan admitting incarnation `inc` of `w` once every survivor has
        entered the plan that has `w` failed (a paused run has no such plan: its survivors
        may never enter the last one, whose world has the dead in it). Only a process still
        alive is admitted: one that died meanwhile would be waited for."""
        p = self.procs.get(w)
        if (p is not None and p.exitcode is not None) or inc <= self.members.incarnation(w):
            self.asking.pop(w, None)
            return
        if self.paused_since is None and not self.reached(-1):
            return
        self.asking.pop(w, None)
        self.admitted(w)
        self.event(f"worker {wkey(w)} is back (incarnation {inc}): publishing the plan that "
                   "includes it")
        self.decide(*self.members.recover(w, inc))

    def coming_back(self) -> bool:
        """May a dead worker still come back: a process of it starting, a due rejoin, or a
        trace with nodes yet to add?"""
        starting = any(w in self.failed and p.exitcode is None for w, p in self.procs.items())
        trace = self.trace is not None and self.trace.may_add()
        return bool(starting or self.asking or self.rejoins.pending or trace)

    def pause_over(self) -> Optional[str]:
        """A paused run (Membership.Pause) waits while a worker may come back: as long as
        the trace runs, else the rejoin limit. The halt reason once it gives up."""
        if self.paused_since is None:
            return None
        if not self.coming_back():
            return f"{self.members.reason}, and no worker is due back"
        waited = time.monotonic() - self.paused_since
        if self.trace is None and waited > self.rejoins.limit:
            return f"{self.members.reason}, and none came back within {waited:.0f} s"
        return None
