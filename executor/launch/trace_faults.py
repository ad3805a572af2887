"""Carrying out a replayed trace (trace_replay.py) in the local coordinator: SIGKILL the
workers a node removal takes, start new processes for the workers a node addition brings
back once their deaths are in a plan."""
from __future__ import annotations

import os
import signal
import time

from executor.protocol import incarnation_key, wkey


class TraceFaults:
    """Mixed into the Coordinator (launcher.py): its processes, store and members."""

    def trace_start(self) -> None:
        """Workers down at the window's start never start; their first process is a
        replacement (incarnation 2), so the plan that admits it is told from v0's."""
        self.trace_t0 = None  # the trace's clock starts once every worker is in (trace_tick)
        self.trace_killed: set[int] = set()  # pids: a node removed, re-added and removed
        # again within one instant (P3 does so) takes one process, not two
        for w in self.trace.initial_failed:
            self.store.add(incarnation_key(w), 1)

    def trace_tick(self, now: float) -> None:
        if self.trace_t0 is None:  # process start-up is not trace time
            if self.version < 0 or not self.reached(-1):
                return
            self.trace_t0 = now
            self.event("trace: every worker is in; replaying the trace from now")
        removed = []
        for e in self.trace.due(now - self.trace_t0):
            if e.kind == "fail":
                for w in e.workers:
                    self.trace.failed(w)
                    p = self.procs.get(w)
                    if p is not None and p.exitcode is None and p.pid not in self.trace_killed:
                        os.kill(p.pid, signal.SIGKILL)
                        self.trace_killed.add(p.pid)
                        removed.append(w)
                        self.trace.kills += 1
                        self.record.kills_at.append((time.time(), w, self.committed + 1))
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
                self.done.pop(w, None)
            self.decide(*self.members.fail_many([(w, None) for w in removed], cause="remove"))
        for w in sorted(self.trace.back):
            p = self.procs.get(w)
            if w in self.failed and (p is None or p.pid in self.reaped):
                self.trace.back.discard(w)
                self.trace.restarts += 1
                self.event(f"trace: node added, starting worker {wkey(w)} (no state)")
                self.spawn(w)
