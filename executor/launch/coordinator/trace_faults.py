"""Carrying out a replayed trace (trace_replay.py) in the local coordinator: SIGKILL the
workers a node removal takes, start new processes for the workers a node addition brings
back once their deaths are in a plan."""
from __future__ import annotations

import os
import signal
from typing import Callable, Optional

from executor.launch.coordinator.admission import Admission
from executor.launch.coordinator.processes import Processes
from executor.launch.coordinator.publishing import Plans
from executor.launch.report.run_record import RunRecord
from executor.launch.coordinator.progress import Progress
from executor.launch.faults.trace_replay import TraceReplay
from executor.protocol import incarnation_key, wkey


class TraceFaults:
    """Owns the trace's clock and the processes it killed."""

    def __init__(self, trace: TraceReplay, processes: Processes, plans: Plans, progress: Progress,
                 admission: Admission, *, record: RunRecord, event: Callable[[str], None]):
        self.trace, self.processes, self.plans, self.progress = trace, processes, plans, progress
        self.admission, self.record, self.event = admission, record, event
        self.t0: Optional[float] = None  # the trace's clock starts once every worker is in
        # pids: a node removed, re-added and removed again within one instant (P3 does so)
        # takes one process, not two
        self.killed: set[int] = set()

    def start(self) -> None:
        """Workers down at the window's start never start; their first process is a
        replacement (incarnation 2), so the plan that admits it is told from v0's."""
        for w in self.trace.initial_failed:
            self.processes.store.add(incarnation_key(w), 1)

    def tick(self, now: float) -> None:
        if self.t0 is None:  # process start-up is not trace time
            if self.plans.version < 0 or not self.admission.reached(-1):
                return
            self.t0 = now
            self.event("trace: every worker is in; replaying the trace from now")
        removed = []
        for e in self.trace.due(now - self.t0):
            if e.kind == "fail":
                for w in e.workers:
                    self.trace.failed(w)
                    pid = self.processes.pid(w)
                    if pid is not None and pid not in self.killed:
                        os.kill(pid, signal.SIGKILL)
                        self.killed.add(pid)
                        removed.append(w)
                        self.trace.kills += 1
                        self.record.killed(w, self.progress.committed + 1)
                        self.event(f"trace: node removed, SIGKILL worker {wkey(w)}")
            elif e.kind == "recover":
                for w in e.workers:
                    self.trace.recovered(w)
        if removed:
            # Everyone this instant removes, in one plan (Membership.fail_many), before their
            # exits come in one by one: planned per death, the first plan could move a
            # worker out of a stage whose other holder the next death takes, leaving no
            # copy of it (the trace-vs-simulate benchmark halted so at two-node instants).
            for w in removed:
                self.progress.forget(w)
            self.plans.decide(*self.plans.members.fail_many([(w, None) for w in removed],
                                                            cause="remove"))
        for w in sorted(self.trace.back):
            if w in self.plans.failed and self.processes.handled(w):
                self.trace.back.discard(w)
                self.trace.restarts += 1
                self.event(f"trace: node added, starting worker {wkey(w)} (no state)")
                self.processes.spawn(w)
