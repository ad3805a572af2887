"""Bringing dead workers back (local processes, or torchrun's restarts): when a due
--rejoin/--restart starts its new process, which iteration training holds for it, when
the plan admitting it is published, and how long a paused run waits for them (rejoins.py
keeps the schedule, planner/control/timing.py says when, membership.py decides the plan)."""
from __future__ import annotations

import time
from typing import Callable, Optional

from executor import protocol as P
from executor.launch.coordinator.processes import Processes
from executor.launch.coordinator.publishing import Plans
from executor.launch.faults.rejoins import Rejoin, RejoinBook
from executor.launch.report.run_record import RunRecord
from executor.launch.coordinator.progress import Progress
from executor.protocol import wkey
from executor.runtime.transport.rendezvous import read_int, set_counter
from planner.control.timing import Patience, admission, pause_verdict
from planner.plan import Plan, home_id

Worker = tuple[int, int]


class Admission:
    """Owns the due rejoins, the newer processes asking in, and (with a service) the deaths
    told to it that no plan has yet."""

    def __init__(self, rejoins: RejoinBook, processes: Processes, plans: Plans, progress: Progress,
                 *, patience: Patience, record: RunRecord, event: Callable[[str], None],
                 service=None):
        self.rejoins, self.processes, self.plans, self.progress = rejoins, processes, plans, progress
        self.service = service  # the plan service's ServiceWatch, if it decides the plans
        self.patience, self.record, self.event = patience, record, event
        self.asking: dict[Worker, int] = {}  # newer processes waiting to be admitted
        self.reported: dict[Worker, int] = {}  # service: deaths told (incarnation), no plan yet

    def restart(self, w: Worker) -> None:
        """Consume the earliest --rejoin/--restart of `w`, if any (one entry per death);
        the process starts later, in spawn_due()."""
        line = self.rejoins.consume(w, time.monotonic(), self.plans.members.incarnation(w))
        if line is not None:
            self.event(line)
            self.update_hold()

    def reached(self, iteration: int) -> bool:
        """Every live worker has entered the plan in force and completed `iteration`."""
        return self.progress.reached(self.plans.live(), self.plans.version, iteration)

    def returning(self, w: Worker, rejoin: Rejoin) -> bool:
        """May `w`'s next process start now? Only once the plan in force has `w` failed
        (its death is a failure event first) and its old process has exited; for --rejoin,
        also once every live worker has completed the iteration before the rejoin's under
        that plan, so the iterations in between train re-routed, every time. A paused run
        trains no iteration until workers are back: its rejoins start at once (locally,
        or when the service's answer to a failure said the job is paused: the iteration
        before the rejoin's would never be reached, and the run hung)."""
        if (w not in self.plans.failed and w not in self.reported) or self.processes.running(w):
            return False
        paused = self.plans.paused_since is not None or (
            self.service is not None and self.service.paused)
        return rejoin.asap or paused or self.reached(rejoin.iteration - 1)

    def spawn_due(self) -> None:
        for w, rejoin in self.rejoins.to_spawn(self.returning):
            self.event(f"restarting worker {wkey(w)} to rejoin at iteration {rejoin.iteration}")
            self.processes.spawn(w)
            rejoin.spawned = time.monotonic()
            self.record.restarted(w, rejoin.iteration)

    def admitted(self, w: Worker) -> None:
        if self.rejoins.drop(w):
            self.update_hold()

    def update_hold(self) -> None:
        """Workers wait before the earliest iteration a pending rejoin is due at."""
        for line in self.rejoins.expire(time.monotonic()):
            self.event(line)
        set_counter(self.processes.store, P.HOLD, self.rejoins.hold())

    def ask(self, w: Worker, inc: int) -> None:
        """A newer process of `w` asked in (its Ready message)."""
        self.asking[w] = max(inc, self.asking.get(w, 0))
        self.admit(w, self.asking[w])

    def admit(self, w: Worker, inc: int) -> None:
        """Publish the plan admitting incarnation `inc` of `w` when planner/control/timing.py
        `admission` says so."""
        verdict = admission(inc, self.plans.members.incarnation(w),
                            alive=not self.processes.exited(w), survivors_entered=self.reached(-1),
                            paused=self.plans.paused_since is not None)
        if verdict == "wait":
            return
        self.asking.pop(w, None)
        if verdict == "stale":
            return
        self.admitted(w)
        self.event(f"worker {wkey(w)} is back (incarnation {inc}): publishing the plan that "
                   "includes it")
        self.plans.decide(*self.plans.members.recover(w, inc))

    def tick(self) -> None:
        if self.rejoins.pending:
            self.spawn_due()
            self.update_hold()
        for w, inc in list(self.asking.items()):
            self.admit(w, inc)

    def followed(self, plan: Plan) -> None:
        """Service mode, a new plan: the deaths it has, the restarts it admitted."""
        store = self.processes.store
        for w, inc in list(self.reported.items()):  # in a plan now: failed, or back
            if w in self.plans.failed or plan.incarnation(*w) > inc:
                del self.reported[w]
        for w in list(self.rejoins.pending):  # the service admitted the restarted process
            if plan.slot_of(home_id(*w)) is not None and self.rejoins.admits(
                    w, plan.incarnation(*w), read_int(store, P.incarnation_key(w))):
                self.admitted(w)
        for w in self.plans.failed:  # declared failed while its process lives on (a stall)
            if self.rejoins.await_failed(w, plan.incarnation(*w)):
                self.update_hold()

    def coming_back(self, trace_adds: bool) -> bool:
        """May a dead worker still come back: a process of it starting, a due rejoin, or a
        trace with nodes yet to add?"""
        starting = any(self.processes.running(w) for w in self.plans.failed)
        return bool(starting or self.asking or self.rejoins.pending or trace_adds)

    def pause_over(self, trace) -> Optional[str]:
        """A paused run (Membership.Pause) waits while a worker may come back: as long as
        the trace runs, else the rejoin limit. The halt reason once it gives up."""
        since = self.plans.paused_since
        return pause_verdict(
            self.plans.members.reason, None if since is None else time.monotonic() - since,
            self.patience, self.coming_back(trace is not None and trace.may_add()),
            open_ended=trace is not None)
