"""The simulation loop: walk a trace's events and integrate what each policy trains.

Between events a policy trains at a constant rate (micro-batches per second). At each
batch of events (same time, same kind) the policy answers with a `Decision`: its new rate,
the seconds nobody trains before that rate starts (detection, reconfiguration, restart),
and what work is lost:
  "inflight"    the iteration in flight: the time since the last iteration boundary
                (iterations start `iter_s` apart from the moment the rate began) times the
                rate (mini-batch rollback);
  "fraction"    that share of the iteration in flight (lossy forward: the failed
                replicas' micro-batches of that iteration are skipped);
  "checkpoint"  everything since the last checkpoint (a global restore);
  "snapshot"    everything since the last peer-memory snapshot: snapshots are taken every
                `snapshot_iters` iterations from the moment the rate began (the elastic
                `recycle` policy's restore of a stage that lost every holder, when the
                boundary logs cannot replay it);
  "replay"      the iteration in flight, and a stall while the lost stage replays the
                iterations since its snapshot from the boundary logs: `replay_s_per_mb`
                seconds for each micro-batch trained since (the others keep their work).
A failure model's events (failure_model.py) add two things before the policy answers: a
hang found by a watchdog `hang_s` after it started stalls the run for that long (the
synchronous job waits on the hung worker; the iteration in flight when it hung is lost),
and announced maintenance is drained (a checkpoint at the event: nothing since is lost).
Neither touches the limit, which pays for no event.
Checkpoints are taken every `checkpoint_every_s` seconds of training and stall everyone
`checkpoint_cost_s`; the clock stops while a policy is halted and restarts at a restore.
A checkpoint due at the very time of an event is taken after it.

Where the time goes is kept for the report's itemised remainder (report.remainder): a
decision names the parts of its stall (`parts`: detection, state moves, restart, ...,
laid end to end from the event), the engine records each stalled second under its part
(`paused` while halted, `checkpoint` for a checkpoint's stall), and the work lost under
its kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from planner.simulation.trace import Event


@dataclass(frozen=True)
class Decision:
    rate: float  # micro-batches per second once running again (0: halted)
    iter_s: float = 0.0  # iteration length at that rate
    lose: str = "none"  # none | inflight | fraction | checkpoint
    fraction: float = 0.0
    stall_s: float = 0.0
    note: str = ""
    parts: tuple = ()  # ((cause, seconds), ...) of stall_s, in order; the rest is "other"
    replay_s_per_mb: float = 0.0  # lose="replay": stall per micro-batch since the snapshot


@dataclass
class Outcome:
    policy: str
    microbatches: float = 0.0  # trained and kept
    lost: float = 0.0  # micro-batches trained and then thrown away (or skipped: lossy)
    stalled_s: float = 0.0  # seconds with nobody training
    failures: int = 0  # failure batches that touched the policy's workers
    restarts: int = 0  # restores from a checkpoint
    segments: list = field(default_factory=list)  # (t0, t1, rate) while training
    notes: list[str] = field(default_factory=list)
    stall_spans: list = field(default_factory=list)  # (t0, t1, cause) while not training
    lost_by: dict = field(default_factory=dict)  # micro-batches lost, per Decision.lose


class Run:
    """One policy's bookkeeping over one trace."""

    def __init__(self, name: str, first: Decision, checkpoint_every_s: float,
                 checkpoint_cost_s: float, snapshot_iters: int = 1):
        self.out = Outcome(name)
        self.t = 0.0
        self.rate, self.iter_s = first.rate, first.iter_s
        self.resume_at = 0.0
        self.since_ckpt = 0.0
        self.ckpt_clock = 0.0
        self.every, self.cost = checkpoint_every_s, checkpoint_cost_s
        self.snapshot_iters = snapshot_iters
        self.pending: list[tuple[float, float, str]] = []  # stall parts laid out ahead

    def _train(self, a: float, b: float) -> None:
        n = self.rate * (b - a)
        self.out.microbatches += n
        self.since_ckpt += n
        self.ckpt_clock += b - a
        segs = self.out.segments
        if segs and segs[-1][1] == a and segs[-1][2] == self.rate:
            segs[-1] = (segs[-1][0], b, self.rate)
        else:
            segs.append((a, b, self.rate))

    def _stall(self, a: float, b: float, cause: Optional[str] = None) -> None:
        """[a, b) with nobody training: under `cause`, else under the pending parts."""
        self.out.stalled_s += b - a
        spans = self.out.stall_spans
        cut = [(a, b, cause)] if cause else []
        if not cause:
            for p0, p1, c in self.pending:
                lo, hi = max(a, p0), min(b, p1)
                if lo < hi:
                    cut.append((lo, hi, c))
            cut.sort()
            at, gaps = a, []
            for lo, hi, _ in cut:  # what no part covers (none should be left): "other"
                if lo > at + 1e-9:
                    gaps.append((at, lo, "other"))
                at = max(at, hi)
            if b > at + 1e-9:
                gaps.append((at, b, "other"))
            cut = sorted(cut + gaps)
        self.pending = [(max(p0, b), p1, c) for p0, p1, c in self.pending if p1 > b]
        for lo, hi, c in cut:
            if spans and spans[-1][2] == c and abs(spans[-1][1] - lo) < 1e-9:
                spans[-1] = (spans[-1][0], hi, c)
            else:
                spans.append((lo, hi, c))

    def advance(self, t: float) -> None:
        cur = self.t
        while cur < t:
            if self.rate <= 0:
                self._stall(cur, t, "paused")
                cur = t
            elif cur < self.resume_at:
                upto = min(t, self.resume_at)
                self._stall(cur, upto)
                cur = upto
            elif self.every > 0 and cur + (self.every - self.ckpt_clock) < t:
                due = cur + (self.every - self.ckpt_clock)
                self._train(cur, due)
                self.since_ckpt, self.ckpt_clock = 0.0, 0.0
                self.resume_at = due + self.cost
                if self.cost > 0:
                    self.pending.append((due, due + self.cost, "checkpoint"))
                cur = due
            else:
                self._train(cur, t)
                cur = t
        self.t = max(self.t, t)

    def hung(self, a: float, b: float) -> None:
        """[a, b): every worker waits on a hung one (failure_model.py) until a watchdog
        finds it; the iteration in flight when it hung is lost."""
        if self.rate > 0:
            if a >= self.resume_at and self.iter_s > 0:
                lost = min(((a - self.resume_at) % self.iter_s) * self.rate,
                           self.out.microbatches)
                self.out.microbatches -= lost
                self.out.lost += lost
                self.out.lost_by["inflight"] = self.out.lost_by.get("inflight", 0.0) + lost
                self.since_ckpt = max(0.0, self.since_ckpt - lost)
            self.pending.append((max(a, self.resume_at), b, "hang"))
            self.resume_at = max(self.resume_at, b)

    def drain(self, t: float) -> None:
        """Announced maintenance: a checkpoint at `t`, before the workers go (nothing
        since it is lost), its cost stalled as any checkpoint's."""
        if self.rate > 0:
            self.since_ckpt, self.ckpt_clock = 0.0, 0.0
            if self.cost > 0:
                self.pending.append((max(t, self.resume_at), max(t, self.resume_at) + self.cost,
                                     "checkpoint"))
                self.resume_at = max(self.resume_at, t) + self.cost

    def apply(self, t: float, d: Optional[Decision]) -> None:
        if d is None:
            return
        in_flight = since_snapshot = 0.0
        if self.rate > 0 and t >= self.resume_at and self.iter_s > 0:
            in_flight = ((t - self.resume_at) % self.iter_s) * self.rate
            since_snapshot = ((t - self.resume_at) % (self.iter_s * self.snapshot_iters)) * self.rate
        lost = {"none": 0.0, "inflight": in_flight, "fraction": in_flight * d.fraction,
                "checkpoint": self.since_ckpt, "snapshot": since_snapshot,
                "replay": in_flight}[d.lose]
        if d.lose == "replay":  # the replay's time: the stage's work since its snapshot
            replay_s = max(0.0, since_snapshot - in_flight) * d.replay_s_per_mb
            d = replace(d, stall_s=d.stall_s + replay_s, parts=tuple(d.parts) + (
                ("replay", replay_s),), lose="inflight")
        lost = min(lost, self.out.microbatches)
        self.out.microbatches -= lost
        self.out.lost += lost
        if lost > 0:
            self.out.lost_by[d.lose] = self.out.lost_by.get(d.lose, 0.0) + lost
        if d.lose == "checkpoint":
            self.since_ckpt, self.ckpt_clock = 0.0, 0.0
            self.out.restarts += 1
        else:
            self.since_ckpt = max(0.0, self.since_ckpt - lost)
        if d.note:
            self.out.notes.append(f"{d.note} at {t:.0f}s")
        self.rate, self.iter_s = d.rate, d.iter_s
        # the stall's parts, end to end from t; what an earlier stall already covers stays
        # that one's
        start, cursor = max(self.resume_at, t), t
        for cause, sec in tuple(d.parts) + (("other", d.stall_s - sum(x for _, x in d.parts)),):
            end = cursor + max(0.0, sec)
            if end > start and end > cursor:
                self.pending.append((max(cursor, start), end, cause))
            cursor = end
        # a stall under way (detection after a failure at this very time, a restart) is not
        # cut short by a later decision: a spare that replaces a node at once stalls no less
        self.resume_at = max(self.resume_at, t + d.stall_s)


def batches(events: list[Event]) -> list[tuple[float, str, list[Event]]]:
    """Consecutive events of one time and one kind, applied together."""
    out: list[tuple[float, str, list[Event]]] = []
    for e in events:
        if out and out[-1][0] == e.time and out[-1][1] == e.kind:
            out[-1][2].append(e)
        else:
            out.append((e.time, e.kind, [e]))
    return out


def run_policy(policy, events: list[Event], initial_failed: frozenset, duration_s: float,
               checkpoint_every_s: float, checkpoint_cost_s: float,
               tick: Optional[Callable[[], None]] = None, snapshot_iters: int = 1) -> Outcome:
    failed = set(initial_failed)
    speed: dict = {}
    run = Run(policy.name, policy.start(frozenset(failed), speed), checkpoint_every_s,
              checkpoint_cost_s, snapshot_iters)
    free = getattr(policy, "free", False)  # the limit: no event costs it anything
    for t, kind, group in batches(events):
        if t >= duration_s:
            break
        hang = max((e.hang_s for e in group), default=0.0) if not free else 0.0
        if hang > 0 and max(run.t, t - hang) < t:  # it waited on a hung worker till found
            run.advance(max(run.t, t - hang))
            run.hung(max(run.t, t - hang), t)
        run.advance(t)
        if not free and any(e.planned for e in group):
            run.drain(t)
        workers = {w for e in group for w in e.workers}
        before = frozenset(failed)
        if kind == "fail":
            workers -= failed
            failed |= workers
        elif kind == "recover":
            workers &= failed
            failed -= workers
        else:
            for e in group:
                for w in e.workers:
                    speed[w] = e.speed
        if workers or kind == "speed":
            decision = policy.on_event(kind, frozenset(workers), before, frozenset(failed),
                                       dict(speed), run)
            if decision is not None and kind == "fail":
                run.out.failures += 1
            run.apply(t, decision)
        if tick:
            tick()
    run.advance(duration_s)
    return run.out
