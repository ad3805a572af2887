"""Failure traces: read from files, map nodes to workers, or generate them.

A trace is a list of `Event`s in time order, each naming the workers it fails, repairs or
slows. Two file formats:

  spot (the Bamboo / Oobleck artifacts' format): CSV lines `t_ms,add|remove,NAME`, no
      header; `t_ms` milliseconds since the start, a node added to or preempted from the
      cluster. Nodes take *slots*: the grid has D*S/G node slots of G workers each
      (`Placement`). An added node fills the lowest free slot, or waits as a spare; a
      removed node frees its slot (its G workers fail) and a waiting spare, if any, takes
      the slot at once (those workers are repaired: a new machine, with no state).
  fail-stop (ours): CSV lines `t_s,fail|recover,R:S` or `t_s,speed,R:S,FACTOR`, seconds
      since the start, one worker per line (`#` comments and blank lines allowed). A speed
      line makes worker R:S a straggler (FACTOR of its nominal speed, 1 = healthy).

The simulation starts at the trace's first timestamp, in the state the events at that
time leave (a spot trace's initial `add`s fill the grid: no failure, no restart).
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from planner.errors import UserError

Worker = tuple[int, int]

# A trace is read and simulated in memory: past this many events the answer would take
# hours to plan anyway (each event may be a new failed set), so refuse up front.
MAX_EVENTS = 200_000
# The longest run we simulate: 10 years. `--hours inf` or 1e9 ask for an endless trace.
MAX_HOURS = 87_600.0


class TraceError(UserError):
    """A trace that cannot be read or does not fit the grid: one line for the user."""


@dataclass(frozen=True)
class Event:
    time: float  # seconds since the start of the simulation
    kind: str  # "fail" | "recover" | "speed"
    workers: tuple[Worker, ...]
    speed: float = 1.0  # for kind "speed"
    # a failure model's (failure_model.py): its cause; a hang's wait before it was found
    # (the job stalled on the hung worker for hang_s up to this event); announced
    # maintenance, drained first (a checkpoint just before: no work lost)
    cause: str = ""
    hang_s: float = 0.0
    planned: bool = False


@dataclass(frozen=True)
class NodeEvent:
    time: float
    kind: str  # "add" | "remove"
    node: str


@dataclass
class Trace:
    events: list[Event]
    start: float = 0.0  # seconds; the events are relative to this (already subtracted)
    initial_failed: frozenset = frozenset()  # workers down when the simulation starts
    end: Optional[float] = None  # the last event's time, for a default duration
    source: str = ""
    node_events: list[NodeEvent] = field(default_factory=list)  # spot form, for --write-trace
    placement: Optional["Placement"] = None  # how node events became worker events

    def node_of(self, worker: Worker) -> int:
        """The node slot a worker is on (a fail-stop trace: each worker its own node)."""
        if self.placement is None:
            return worker[0] * 1_000_003 + worker[1]
        return self.placement.node(worker)

    def placed(self, placement: "Placement") -> "Trace":
        """The same node events through another placement (None if not a node trace)."""
        if not self.node_events:
            return self
        out = spot_trace(self.node_events, placement, self.source)
        out.end = self.end
        return out

    @property
    def failures(self) -> int:
        return sum(1 for e in self.events if e.kind == "fail")


@dataclass(frozen=True)
class Placement:
    """Which workers a node holds. `stages`: a node holds G consecutive stages of one
    replica (ranks r*G .. r*G+G-1 with rank = replica*S + stage: how a pipeline is usually
    packed, its p2p traffic inside the node). `replicas`: a node holds one stage of G
    consecutive replicas (the data-parallel peers of a stage share the node)."""
    replicas: int
    stages: int
    gpus_per_node: int = 1
    kind: str = "stages"

    def __post_init__(self):
        G, D, S = self.gpus_per_node, self.replicas, self.stages
        if G < 1:
            raise TraceError("--gpus-per-node must be at least 1")
        if self.kind not in ("stages", "replicas"):
            raise TraceError(f"unknown placement {self.kind!r}; choose stages or replicas")
        if self.kind == "stages" and S % G:
            raise TraceError(f"placement 'stages' needs --gpus-per-node ({G}) to divide the "
                             f"stages ({S})")
        if self.kind == "replicas" and D % G:
            raise TraceError(f"placement 'replicas' needs --gpus-per-node ({G}) to divide the "
                             f"replicas ({D})")

    @property
    def nodes(self) -> int:
        return self.replicas * self.stages // self.gpus_per_node

    def node(self, worker: Worker) -> int:
        d, s = worker
        G = self.gpus_per_node
        if self.kind == "stages":
            return d * (self.stages // G) + s // G
        return s * (self.replicas // G) + d // G

    def workers(self, node: int) -> tuple[Worker, ...]:
        G, D, S = self.gpus_per_node, self.replicas, self.stages
        if self.kind == "stages":
            per = S // G  # nodes per replica
            d, first = divmod(node, per)
            return tuple((d, first * G + i) for i in range(G))
        per = D // G  # nodes per stage
        s, first = divmod(node, per)
        return tuple((first * G + i, s) for i in range(G))


# ---- reading ------------------------------------------------------------------------
_SPOT = re.compile(r"^\s*(-?\d+(?:\.\d*)?)\s*,\s*(add|remove)\s*,\s*(\S+)\s*$")
_FAILSTOP = re.compile(r"^\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*,\s*(fail|recover|speed)\s*,"
                       r"\s*(\d+):(\d+)\s*(?:,\s*(\S+)\s*)?$")


def _lines(path: str) -> list[tuple[int, str]]:
    out = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for no, line in enumerate(fh, 1):
            text = line.strip()
            if text and not text.startswith("#"):
                out.append((no, text))
                if len(out) > MAX_EVENTS:
                    raise TraceError(f"{path}: more than {MAX_EVENTS} events; "
                                     f"simulate a shorter trace")
    return out


def detect_format(path: str) -> str:
    for _, text in _lines(path)[:1]:
        return "spot" if re.match(r"^[^,]*,\s*(add|remove)\s*,", text) else "failstop"
    raise TraceError(f"{path}: empty trace")


def read_trace(path: str, placement: Placement, fmt: str = "auto") -> Trace:
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "spot":
        return spot_trace(read_spot(path), placement, source=path)
    if fmt == "failstop":
        if placement.gpus_per_node != 1:
            raise TraceError("--gpus-per-node applies to node traces (spot format, synthetic); "
                             "a fail-stop trace names each worker")
        return read_failstop(path, placement.replicas, placement.stages)
    raise TraceError(f"unknown trace format {fmt!r}; choose auto, spot or failstop")


def read_spot(path: str) -> list[NodeEvent]:
    out, last = [], -math.inf
    for no, text in _lines(path):
        m = _SPOT.match(text)
        if not m:
            raise TraceError(f"{path} line {no}: expected t_ms,add|remove,nodeN, got {ascii(text[:50])}")
        t = float(m.group(1)) / 1000.0
        if t < 0 or t < last:
            raise TraceError(f"{path} line {no}: time {m.group(1)} ms is "
                             f"{'negative' if t < 0 else 'earlier than the line before'}")
        last = t
        out.append(NodeEvent(t, m.group(2), m.group(3)))
    if not out:
        raise TraceError(f"{path}: empty trace")
    return out


def spot_trace(node_events: list[NodeEvent], placement: Placement, source: str = "") -> Trace:
    """Node adds/removes to worker events through node slots (module docstring)."""
    slots: list[Optional[str]] = [None] * placement.nodes
    where: dict[str, Optional[int]] = {}  # node -> slot (None: a waiting spare)
    spares: list[str] = []
    t0 = node_events[0].time
    events: list[Event] = []
    initial: set[Worker] = {w for n in range(placement.nodes) for w in placement.workers(n)}

    def emit(t, kind, slot):
        workers = placement.workers(slot)
        if t == t0:  # the starting state, not an event
            (initial.difference_update if kind == "recover" else initial.update)(workers)
        else:
            events.append(Event(t - t0, kind, workers))

    for i, e in enumerate(node_events, 1):
        if e.kind == "add":
            if e.node in where:
                raise TraceError(f"{source} event {i}: {e.node} added twice")
            free = next((k for k, n in enumerate(slots) if n is None), None)
            where[e.node] = free
            if free is None:
                spares.append(e.node)
            else:
                slots[free] = e.node
                emit(e.time, "recover", free)
        else:
            if e.node not in where:
                raise TraceError(f"{source} event {i}: {e.node} removed but not in the cluster")
            slot = where.pop(e.node)
            if slot is None:
                spares.remove(e.node)
                continue
            slots[slot] = None
            emit(e.time, "fail", slot)
            if spares:
                spare = spares.pop(0)
                slots[slot], where[spare] = spare, slot
                emit(e.time, "recover", slot)
    return Trace(events, start=t0, initial_failed=frozenset(initial),
                 end=node_events[-1].time - t0, source=source, node_events=node_events,
                 placement=placement)


def read_failstop(path: str, replicas: int, stages: int) -> Trace:
    events, last = [], -math.inf
    for no, text in _lines(path):
        m = _FAILSTOP.match(text)
        if not m:
            raise TraceError(f"{path} line {no}: expected t_s,fail|recover,R:S or "
                             f"t_s,speed,R:S,FACTOR, got {ascii(text[:50])}")
        t, kind = float(m.group(1)), m.group(2)
        d, s, extra = int(m.group(3)), int(m.group(4)), m.group(5)
        if not math.isfinite(t) or t < 0 or t < last:
            raise TraceError(f"{path} line {no}: time {m.group(1)} s is "
                             f"{'earlier than the line before' if t >= 0 else 'negative'}")
        if not (d < replicas and s < stages):
            raise TraceError(f"{path} line {no}: worker {d}:{s} is outside the "
                             f"{replicas}x{stages} grid")
        speed = 1.0
        if kind == "speed":
            try:
                speed = float(extra)
            except (TypeError, ValueError):
                speed = math.nan
            if not (0 < speed <= 100):
                raise TraceError(f"{path} line {no}: speed needs a factor in (0, 100], "
                                 f"got {extra!r}")
        elif extra is not None:
            raise TraceError(f"{path} line {no}: {kind} takes no factor")
        last = t
        events.append(Event(t, kind, ((d, s),), speed))
    if not events:
        raise TraceError(f"{path}: empty trace")
    return Trace(events, end=events[-1].time, source=path)


# ---- writing (spot format) ------------------------------------------------------------
def write_spot(path: str, node_events: Iterable[NodeEvent]) -> None:
    with open(path, "w") as fh:
        for e in node_events:
            fh.write(f"{round(e.time * 1000)},{e.kind},{e.node}\n")


# ---- synthetic traces (node level: node k always holds slot k) -------------------------
def _check_hours(duration_s: float) -> None:
    if not (math.isfinite(duration_s) and 0 < duration_s <= MAX_HOURS * 3600):
        raise TraceError(f"--hours must be a number in (0, {MAX_HOURS:g}]")


def _from_nodes(node_events: list[NodeEvent], placement: Placement, duration_s: float,
                source: str) -> Trace:
    n = placement.nodes
    initial = [NodeEvent(0.0, "add", f"node{k}") for k in range(n)]
    out = spot_trace(initial + node_events, placement, source)
    out.end = duration_s
    return out


def fixed_interval_trace(placement: Placement, duration_s: float, every_s: float,
                         repair_s: float, seed: int = 0) -> Trace:
    """One node failure every `every_s` (Oobleck's artifact: 6 h, 3 h, 1 h, 30 min,
    10 min), at a live node drawn at random (seeded), back after `repair_s`."""
    _check_hours(duration_s)
    if not (every_s > 0 and math.isfinite(every_s)) or not (repair_s >= 0 and math.isfinite(repair_s)):
        raise TraceError("the failure interval must be positive and the repair time >= 0")
    if duration_s / every_s > MAX_EVENTS / 2:
        raise TraceError(f"more than {MAX_EVENTS} events: a longer interval or fewer hours")
    rng = random.Random(seed)
    down_until = [0.0] * placement.nodes
    out: list[NodeEvent] = []
    t = every_s
    while t < duration_s:
        live = [k for k in range(placement.nodes) if down_until[k] <= t]
        if live:
            k = rng.choice(live)
            down_until[k] = t + repair_s
            out.append(NodeEvent(t, "remove", f"node{k}"))
            if t + repair_s < duration_s:
                out.append(NodeEvent(t + repair_s, "add", f"node{k}"))
        t += every_s
    out.sort(key=lambda e: e.time)  # stable: each node's events stay in causal order
    return _from_nodes(out, placement, duration_s, f"one failure every {_fmt_s(every_s)}")


def exponential_trace(placement: Placement, duration_s: float, mtbf_gpu_s: float,
                      repair_s: float, seed: int = 0) -> Trace:
    """Independent exponential failures: each GPU fails with mean time `mtbf_gpu_s`, so a
    node of G GPUs with mean `mtbf_gpu_s / G`; a node is back `repair_s` after it fails
    and cannot fail while down."""
    _check_hours(duration_s)
    if not (mtbf_gpu_s > 0 and math.isfinite(mtbf_gpu_s)) or not (repair_s >= 0 and math.isfinite(repair_s)):
        raise TraceError("the MTBF must be positive and the repair time >= 0")
    mean = mtbf_gpu_s / placement.gpus_per_node
    expected = placement.nodes * duration_s / (mean + repair_s)
    if expected > MAX_EVENTS / 2:
        raise TraceError(f"about {expected:.3g} failures expected, over {MAX_EVENTS // 2}: "
                         f"a longer MTBF or fewer hours")
    rng = random.Random(seed)
    out: list[NodeEvent] = []
    for k in range(placement.nodes):
        t = rng.expovariate(1 / mean)
        while t < duration_s:
            out.append(NodeEvent(t, "remove", f"node{k}"))
            if t + repair_s < duration_s:
                out.append(NodeEvent(t + repair_s, "add", f"node{k}"))
            t += repair_s + rng.expovariate(1 / mean)
    out.sort(key=lambda e: e.time)  # stable: causal order per node
    return _from_nodes(out, placement, duration_s,
                       f"exponential, MTBF {_fmt_s(mtbf_gpu_s)} per GPU, repair {_fmt_s(repair_s)}")


def spot_like_trace(placement: Placement, duration_s: float, seed: int = 0,
                    burst_every_s: float = 2 * 3600, max_burst: int = 4,
                    replace_s: float = 20 * 60) -> Trace:
    """A synthetic spot-instance trace, as preemptions come on spot markets: bursts
    (mean one every `burst_every_s`) of 1..`max_burst` nodes preempted within a minute,
    each replaced by a new node after an exponential wait (mean `replace_s`). Written in
    the spot format it is what the Bamboo / Oobleck artifacts replay."""
    _check_hours(duration_s)
    rng = random.Random(seed)
    out: list[NodeEvent] = [NodeEvent(0.0, "add", f"node{k}") for k in range(placement.nodes)]
    live = [f"node{k}" for k in range(placement.nodes)]
    pending: list[tuple[float, str]] = []
    fresh = placement.nodes
    t = rng.expovariate(1 / burst_every_s)
    while t < duration_s and len(out) < MAX_EVENTS:
        # replacements that arrived before this burst
        for when, name in sorted(pending):
            if when <= t:
                live.append(name)
        pending = [p for p in pending if p[0] > t]
        for _ in range(min(len(live), rng.randint(1, max_burst))):
            name = live.pop(rng.randrange(len(live)))
            when = t + rng.uniform(0, 60)
            if when >= duration_s:
                break
            out.append(NodeEvent(when, "remove", name))
            back = when + rng.expovariate(1 / replace_s)
            if back < duration_s:
                new = f"node{fresh}"
                fresh += 1
                out.append(NodeEvent(back, "add", new))
                pending.append((back, new))
        t += 60 + rng.expovariate(1 / burst_every_s)
    out.sort(key=lambda e: e.time)  # stable: causal order per node
    trace = spot_trace(out, placement, "synthetic spot trace")
    trace.end = duration_s
    return trace


def _fmt_s(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def parse_duration(text: str) -> float:
    """`6h`, `30m`, `10min`, `90s` or plain seconds, as seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(h|m|min|s)?\s*", text)
    if not m:
        raise TraceError(f"cannot read duration {text!r}: use e.g. 6h, 30m, 90s")
    value = float(m.group(1)) * {"h": 3600, "m": 60, "min": 60, "s": 1, None: 1}[m.group(2)]
    if value <= 0:
        raise TraceError(f"duration {text!r} must be positive")
    return value
