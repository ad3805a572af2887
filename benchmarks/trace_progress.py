"""The pure parts of benchmarks/trace_vs_simulate.py: a spot trace's window as files
`recycle simulate` reads, and the progress a run made, from its time-stamped output lines.

No processes here, no torch: tests/test_trace_vs_simulate.py runs all of it in a second.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Optional

from executor.launch.faults.trace_replay import window
from planner.simulation.trace import Trace, read_spot, write_spot

Worker = tuple[int, int]


# ---- the window as trace files ----------------------------------------------------------
def write_window(trace_path: str, start_s: float, hours: float, out_path: str) -> int:
    """`recycle train --trace-start/--trace-hours`'s window of a spot trace, written in the
    spot format (re-timed from 0: the nodes up at the start are added at 0), so that
    `recycle simulate --trace out_path --hours H` replays the same node events. Returns the
    number of the window's own node events (after its start)."""
    events = window(read_spot(trace_path), start_s, hours)
    write_spot(out_path, events)
    return sum(1 for e in events if e.time > 0)


def write_eventless(out_path: str, nodes: int) -> None:
    """A spot trace of `nodes` nodes that are up from the start and never leave: the
    failure-free run replays it, so its clock starts as the trace run's does."""
    write_spot(out_path, [_add(f"node{k}") for k in range(nodes)])


def _add(name: str):
    from planner.simulation.trace import NodeEvent
    return NodeEvent(0.0, "add", name)


def delayed_events(trace: Trace, delay_s: float) -> list[tuple[float, str, Worker]]:
    """The trace's worker events with every recovery `delay_s` later (a replacement process
    takes that long to start), in time order: what the replay really did. A failure of a
    worker whose delayed recovery is still pending cancels it (the replay's restart of a
    worker whose node left again is off, trace_replay.TraceReplay.failed)."""
    out: list[Optional[tuple[float, str, Worker]]] = [(0.0, "fail", w)
                                                      for w in sorted(trace.initial_failed)]
    pending: dict[Worker, int] = {}  # worker -> index of its scheduled recovery
    for e in trace.events:
        for w in e.workers:
            if e.kind == "fail":
                i = pending.pop(w, None)
                if i is not None and out[i][0] > e.time:
                    out[i] = None
                out.append((e.time, "fail", w))
            elif e.kind == "recover":
                pending[w] = len(out)
                out.append((e.time + delay_s, "recover", w))
    return sorted((x for x in out if x is not None), key=lambda x: x[0])


def write_failstop(path: str, events: list[tuple[float, str, Worker]]) -> None:
    """Worker events in `recycle simulate`'s fail-stop format (t_s,fail|recover,R:S)."""
    with open(path, "w") as fh:
        for t, kind, (d, s) in events:
            fh.write(f"{t:.3f},{kind},{d}:{s}\n")


# ---- a run's progress from its lines ------------------------------------------------------
_ITER = re.compile(r"^iter\s+(\d+)\s")
_START = re.compile(r"trace: node added, starting worker (\d+):(\d+)")
_BACK = re.compile(r"worker (\d+):(\d+) is back")
_KILL = re.compile(r"trace: node removed, SIGKILL worker (\d+):(\d+)")
_DIED = re.compile(r"^worker (\d+):(\d+) failed \(")


@dataclass
class RunLog:
    """What `recycle train --trace`'s output lines say, on the reader's clock (seconds)."""
    t0: Optional[float] = None  # the trace's clock started (every worker is in)
    iters: list[tuple[float, int]] = field(default_factory=list)  # (t, iterations done)
    starts: list[float] = field(default_factory=list)  # replacement start to back, seconds
    last_back: Optional[float] = None  # when the last replacement was back
    first_kill: Optional[float] = None  # the trace's first SIGKILL
    kills: int = 0  # SIGKILLs sent (one process may get two in one tick)
    deaths: int = 0  # worker processes that died
    halted: bool = False
    halt_reason: str = ""
    end: Optional[float] = None  # the last line

    def done_by(self, t: float) -> float:
        """Iterations complete by time t: lines come at most every 0.25 s, so linear in
        between (from 0 at t0); an iteration rolled back and trained again is counted once,
        when it first completed, so a rollback shows as time with no new iteration."""
        pts = [(self.t0, 0)] + self.iters
        if t <= pts[0][0]:
            return 0.0
        for (ta, ca), (tb, cb) in zip(pts, pts[1:]):
            if t <= tb:
                return ca + (cb - ca) * (t - ta) / max(tb - ta, 1e-9)
        return float(pts[-1][1])

    def covers(self, t: float) -> bool:
        """Whether the run was still training at t (its last iteration came later)."""
        return bool(self.iters) and self.iters[-1][0] >= t


def parse_lines(lines: list[tuple[float, str]]) -> RunLog:
    log, started = RunLog(), {}
    for t, text in lines:
        text = text.strip()
        log.end = t
        m = _ITER.match(text)
        if m:
            log.iters.append((t, int(m.group(1)) + 1))
        elif text.startswith("trace: every worker is in"):
            log.t0 = t
        elif (m := _START.search(text)):
            started[(int(m.group(1)), int(m.group(2)))] = t
        elif (m := _BACK.search(text)):
            w = (int(m.group(1)), int(m.group(2)))
            log.last_back = t
            if w in started:
                log.starts.append(t - started.pop(w))
        elif _KILL.search(text):
            log.kills += 1
            log.first_kill = t if log.first_kill is None else log.first_kill
        elif _DIED.match(text):
            log.deaths += 1
        elif "training halted" in text:
            log.halted, log.halt_reason = True, text
    if log.t0 is None:
        raise ValueError("no 'trace: every worker is in' line: the run replayed no trace")
    return log


def window_progress(log: RunLog, window_s: float, halted: bool = False) -> float:
    """Iterations the run completed in the trace's compressed window [t0, t0 + window_s];
    ValueError if it stopped training before the window's end with no halt (too few
    iterations: the window's rest would count as lost)."""
    if not halted and not log.covers(log.t0 + window_s):
        raise ValueError(f"the run stopped training {log.iters[-1][0] - log.t0 if log.iters else 0:.1f}"
                         f" s into a {window_s:.1f} s window: give more --iterations")
    return log.done_by(log.t0 + window_s)


def own_rate(log: RunLog, window_s: float) -> Optional[float]:
    """The run's failure-free rate (iterations per second) on the machine as loaded during
    the run: over its stretches with every worker up, from t0 to the trace's first
    SIGKILL and from a second after the window's end (and after the last replacement is
    back) to its last iteration. None if those stretches last under a second."""
    end = log.iters[-1][0] if log.iters else log.t0
    pre = (log.t0, min(end, log.first_kill if log.first_kill is not None else log.t0 + window_s))
    post = (max(log.t0 + window_s, log.last_back or 0.0) + 1.0, end)
    spans = [(a, b) for a, b in (pre, post) if b > a]
    seconds = sum(b - a for a, b in spans)
    if seconds < 1.0:
        return None
    return sum(log.done_by(b) - log.done_by(a) for a, b in spans) / seconds


def median_or(values, default: float = 0.0) -> float:
    return statistics.median(values) if values else default


def recovery_seconds(summary: dict) -> list[float]:
    """Seconds from each SIGKILL to every survivor training under the plan without the
    worker (the summary's `recovery`, kills only)."""
    return [r["seconds"] for r in summary.get("recovery") or [] if r["kind"] == "kill"]


def restore_events(summary: dict) -> int:
    """Plan versions the run trained under that restored some stage from a peer-memory
    snapshot (a rollback each: what the simulator counts as a snapshot restore; the
    summary's `snapshot_restores` counts the workers that loaded one)."""
    return sum(1 for p in summary.get("plans") or []
               if any(m.get("source") == "snapshot" for m in p.get("moves") or []))


JUMP_FROM, JUMP_TO, JUMP_WITHIN = 1e-6, 1e-5, 50


def closeness(a: dict, b: dict) -> dict:
    """How two runs' summaries agree: the first iteration whose losses differ at all, the
    first whose losses differ by over 1e-5, the largest loss difference, the largest
    difference of a loss or stage checksum scaled as `compare` scales it (|x - y| /
    max(1, |x|, |y|)), and `jump`: the first iteration whose loss differs by over
    JUMP_TO when none of the JUMP_WITHIN before it differed by JUMP_FROM. fp32 rounding
    (a micro-batch summed in another order) grows gradually, about 10x in 130 iterations
    here; a wrong state shows at once."""
    la, lb = a["losses"], b["losses"]
    d = [abs(x - y) for x, y in zip(la, lb)]
    pairs = list(zip(la, lb)) + list(zip(a["param_checksums"], b["param_checksums"]))
    return {"first_difference": next((i for i, x in enumerate(d) if x > 0), None),
            "first_over_1e-5": next((i for i, x in enumerate(d) if x > JUMP_TO), None),
            "jump": next((i for i, x in enumerate(d) if x > JUMP_TO and
                          max(d[max(0, i - JUMP_WITHIN):i], default=0.0) < JUMP_FROM), None),
            "max_loss_diff": max(d, default=0.0),
            "max_scaled_diff": max((abs(x - y) / max(1.0, abs(x), abs(y)) for x, y in pairs),
                                   default=0.0),
            "same_length": len(la) == len(lb) and
            len(a["param_checksums"]) == len(b["param_checksums"])}


def first_replan(summary: dict) -> Optional[int]:
    """The first iteration trained under a plan version after v0 (None: never re-planned)."""
    its = [p["first_iteration"] for p in summary.get("plans") or [] if p.get("version", 0) > 0]
    return min(its) if its else None


def identical_until_replan(c: dict, replan: Optional[int]) -> bool:
    """The losses were bit-identical to the failure-free run's until the first re-plan."""
    if not c["same_length"]:
        return False
    return c["first_difference"] is None or (replan is not None and c["first_difference"] >= replan)


def simulated(sim_json: dict, policy: str = "recycle-short") -> dict:
    """The policy's row of `recycle simulate --json`, with its moves, restores and shape
    changes. By default the policy the runtime carries out: `recycle-short` (roles on the
    job's partition, the shape cut only once fewer workers than stages live)."""
    row = next(p for p in sim_json["policies"] if p["policy"] == policy)
    stats = (sim_json.get("stats") or {}).get(policy) or {}
    return {"policy": policy, "kept": row["kept"], "samples": row["samples"],
            "failures": row["failures"], "restarts": row["restarts"],
            "moves": stats.get("moves"), "snapshot_restores": stats.get("snapshot_restores"),
            "shape_changes": stats.get("shape_changes", 0)}
