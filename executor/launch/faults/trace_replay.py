"""A failure trace replayed on real processes (`recycle train --trace`).

The trace's node events become worker events through the simulator's own placement
(planner/simulation/trace.py: a node holds G workers; a removed node's workers fail, an
added node or a waiting spare takes a free node slot, its workers come back with no
state). Trace time runs `time_scale` times faster than the run's wall clock. A failure
SIGKILLs the workers' processes; a recovery starts a new process for each worker once its
death is in a plan (it joins with no state, in the slot the plan gives it). Pure
bookkeeping: the coordinator asks what is due and carries it out (trace_faults.py).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from planner.simulation.trace import (NodeEvent, Placement, Trace, TraceError, parse_duration,
                                      read_spot, spot_trace)

Worker = tuple[int, int]


def window(node_events: list[NodeEvent], start_s: float, hours: float) -> list[NodeEvent]:
    """The node events of [start, start + hours) of a spot trace, re-timed from 0: the nodes
    up at `start` are added at 0 (in the order they came), then the window's own events."""
    if not node_events:
        raise TraceError("empty trace")
    t0 = node_events[0].time + start_s
    end = t0 + hours * 3600
    length = node_events[-1].time - node_events[0].time
    if start_s > 0 and start_s >= length:
        raise TraceError(f"--trace-start {start_s / 3600:g} h is past the trace's end "
                         f"({length / 3600:.3g} h)")
    up: dict[str, None] = {}
    out: list[NodeEvent] = []
    for e in node_events:
        if e.time <= t0:
            (up.__setitem__(e.node, None) if e.kind == "add" else up.pop(e.node, None))
        elif e.time < end:
            out.append(NodeEvent(e.time - t0, e.kind, e.node))
    if not up:
        raise TraceError(f"no node is up {start_s / 3600:g} h into the trace")
    return [NodeEvent(0.0, "add", n) for n in up] + out


def load_window(path: str, placement: Placement, start_s: float, hours: float) -> Trace:
    """A spot trace file's window, as worker events for `placement`."""
    return spot_trace(window(read_spot(path), start_s, hours), placement, source=path)


def trace_faults(faults, path: str, replicas: int, stages: int, start: str, hours: float,
                 gpus_per_node: int, placement: str, time_scale: float, external: bool,
                 service: bool):
    """`faults` with `recycle train --trace`'s replay; TraceError (one line) for flags no
    replay could follow."""
    if external or service:  # the replay kills and starts this machine's own processes
        raise TraceError(f"--trace replays node events on the workers this command starts: "
                         f"it cannot apply with {'--external' if external else '--service'}")
    if faults.kills or faults.rejoins or faults.restarts:
        raise TraceError("--trace says who fails and comes back: leave out --kill, --rejoin "
                         "and --restart")
    if not (math.isfinite(hours) and hours > 0):
        raise TraceError(f"--trace-hours must be positive, not {hours:g}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise TraceError(f"--time-scale must be positive, not {time_scale:g}")
    start_s = 0.0 if start.strip() in ("0", "") else parse_duration(start)
    tr = load_window(path, Placement(replicas, stages, gpus_per_node, placement), start_s,
                     hours)
    if len(tr.initial_failed) == replicas * stages:
        raise TraceError(f"no worker is up {start} into {path}: the run has nobody to start")
    return dataclasses.replace(faults, trace=TraceReplay(tr, time_scale))


@dataclass
class TraceReplay:
    trace: Trace
    time_scale: float
    next_event: int = 0
    back: set = field(default_factory=set)  # workers to restart once their death is in a plan
    kills: int = 0
    restarts: int = 0

    def __post_init__(self):
        if not self.time_scale > 0:
            raise TraceError(f"--time-scale must be positive, not {self.time_scale:g}")

    @property
    def initial_failed(self) -> frozenset:
        return self.trace.initial_failed

    def due(self, elapsed_s: float) -> list:
        """The trace's events due `elapsed_s` wall seconds into the run, in order."""
        out = []
        events = self.trace.events
        while (self.next_event < len(events)
               and events[self.next_event].time / self.time_scale <= elapsed_s):
            out.append(events[self.next_event])
            self.next_event += 1
        return out

    def failed(self, w: Worker) -> None:
        """The trace removes `w`: a pending restart of it is off (its node left again)."""
        self.back.discard(w)

    def recovered(self, w: Worker) -> None:
        self.back.add(w)

    def applied(self) -> int:
        return self.next_event

    def may_add(self) -> bool:
        """May the trace still bring a worker back: one added and not yet restarted, or
        events left to replay?"""
        return bool(self.back) or self.next_event < len(self.trace.events)

    def line(self) -> str:
        return (f"trace: {self.next_event}/{len(self.trace.events)} events replayed at "
                f"{self.time_scale:g}x, {self.kills} workers killed, {self.restarts} restarted")
