"""Choosing the shape for the live workers (docs/design.md section 12).

Each shape of the job's family (planner/shapes/shape.py) is worth what it trains before
the next event, as a role choice is (planner/control/halt_risk.py): its expected
iterations over the horizon, `(horizon - stall) / period` when nothing is at risk. Every
shape runs the same global batch, so iterations compare across shapes.
  - the current shape: the best role choice on it (choose_roles: the live workers keep
    their slots, or move between its stages);
  - another shape, of the family (the balanced cut for each stage count) or cut to fit n
    live workers when its stage count does not divide n (shape.fitted): its best filled
    slots for n workers (`fresh`: the least period over the counts of n workers, the
    slots packed into whole replicas), with the stall of the state the live workers must
    fetch to take them (planner/shapes/transition.py).
The shape changes only when another one is worth more than the current one (by `margin`
when the periods are bounds rather than plans), so the time it saves over the horizon
must exceed the stall it costs. A shape is skipped unseen when even its proven least
period (elastic_bound: no assignment of n workers beats it) with no stall cannot beat the
best so far, which is what keeps the choice to milliseconds at thousands of workers.

`period(shape, failed)` gives a filled-slot set's period (the planner's); without it the
count bound stands in (no planning), as for roles.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, Optional

from planner.control.count_bounds import NoRolesError, best_counts, count_bound, elastic_bound
from planner.control.halt_risk import expected_work, one_copy_stages
from planner.control.roles import _roles, choose_roles
from planner.job import JobSpec
from planner.plan import Move, Role
from planner.shapes.shape import Shape, family, fitted, replicas_for, shaped_job
from planner.shapes.transition import missing, transport
from planner.shapes.units import Units, units_of_job

Slot = tuple[int, int]
Period = Callable[[Shape, list[Slot]], int]


@dataclass(frozen=True)
class ShapeOption:
    """One shape weighed: its stage count, period, stall and worth (iterations)."""
    stages: int
    period: int
    stall: int
    value: float
    current: bool


@dataclass(frozen=True)
class ShapeChoice:
    shape: Shape
    slots: dict  # slot of shape.job -> the live worker that fills it
    moves: list[Move]  # workers that load state they do not hold (bytes: what they lack)
    failed: list[Slot]  # the empty slots: the failed set the schedule is planned for
    counts: list[int]
    period: int
    stall: int  # time units the loads stall the job
    changed: bool  # another shape than the current one
    reason: str  # why, when changed
    options: list[ShapeOption] = field(default_factory=list)

    @cached_property
    def roles(self) -> list[Role]:
        return _roles(self.slots)


class ShapeChooser:
    """The family of one job and what its shapes are worth; memoises each shape's best
    filled slots per live count (they depend on nothing else)."""

    def __init__(self, job: JobSpec, units: Optional[Units] = None,
                 period: Optional[Period] = None, snapshots: bool = False,
                 margin: float = 0.0):
        self.job, self.units = job, units or units_of_job(job)
        self.family = family(job, self.units)
        self.period, self.snapshots, self.margin = period, snapshots, margin
        self._fresh: dict[tuple, Optional[tuple]] = {}
        self._jobs = {s.bounds: s.job for s in self.family if not s.fixed}
        self._cands: dict[int, list[Shape]] = {}
        prefix = [0.0]
        for u in self.units.units:
            prefix.append(prefix[-1] + u.state_bytes)
        self._state = prefix
        self._work = sum(u.work for u in self.units.units)

    @property
    def fixed(self) -> Shape:
        return self.family[0]

    # ---- the shapes for n live workers ---------------------------------------------
    def fitted_counts(self, n: int) -> list[tuple[int, ...]]:
        """For each stage count S', the live counts a cut may be fitted to (shape.fitted):
        S' does not divide n, so r stages get one worker more, the first r or the last r
        (early stages wait longer for their first gradient, late ones less)."""
        out = []
        top = min(self.job.stages, len(self.units.units))
        for S in range(top, max(1, self.units.min_stages) - 1, -1):
            R = replicas_for(self.job, S)
            m = min(n, R * S)
            if m < S:
                continue
            q, r = divmod(m, S)
            pats = {tuple(q + (k < r) for k in range(S)), tuple(q + (k >= S - r) for k in range(S))}
            out += [c for c in sorted(pats) if max(c) <= R]
        return out

    def fitted_shape(self, counts: tuple[int, ...]) -> Optional[Shape]:
        """The shape whose cut is fitted to `counts` (None if none fits a worker)."""
        b = fitted(self.job, self.units, counts)
        if b is None:
            return None
        is_fixed = b == tuple(self.units.fixed)
        job = self.job if is_fixed else self._job(b)
        return None if job is None else Shape(b, job, is_fixed, counts)

    def candidates(self, n: int) -> list[Shape]:
        """The family, and the cuts fitted to n workers (fitted_counts)."""
        if n not in self._cands:
            out = list(self.family)
            seen = {(s.bounds, s.fixed) for s in out}
            for counts in self.fitted_counts(n):
                shape = self.fitted_shape(counts)
                if shape is not None and (shape.bounds, shape.fixed, counts) not in seen:
                    seen.add((shape.bounds, shape.fixed, counts))
                    out.append(shape)
            if len(self._cands) > 4096:
                self._cands.clear()
            self._cands[n] = out
        return self._cands[n]

    def _fitted_bound(self, counts: tuple[int, ...]) -> float:
        """A lower bound on the period of any cut of the units served by `counts`, before
        the cut is made: stage k's workers run m_k = ceil(D*M / counts[k]) micro-batches
        each, so with a share W_k of the work per micro-batch some stage spans at least T
        with sum_k T / m_k >= W, the work cut as finely as one likes. (It bounds the cut
        with the counts it is fitted to; `fresh` also tries the cut with other counts,
        which a skipped cut is not given: a fitted cut is made for its counts.)"""
        DM = self.job.num_microbatches
        return self._work / sum(1 / -(-DM // c) for c in counts)

    def _job(self, bounds) -> Optional[JobSpec]:
        """One job per cut, shared by every shape with that cut (periods are memoised on it)."""
        if bounds not in self._jobs:
            if len(self._jobs) > 4096:
                self._jobs = {s.bounds: s.job for s in self.family if not s.fixed}
            self._jobs[bounds] = shaped_job(self.job, self.units, bounds)
        return self._jobs[bounds]

    # ---- a shape's best use of n workers, no cost counted ---------------------------
    def fresh(self, shape: Shape, n: int) -> Optional[tuple[list[int], list[Slot], int]]:
        """(counts, empty slots, period) of the least period n workers reach on `shape`
        when they may fill any slots: the counts with the least count bound (and, with
        planned periods, those balancing the stages' work alone), packed into whole
        replicas. None if n workers cannot fill every stage."""
        key = (shape.bounds, shape.fixed, shape.counts, n)
        if key not in self._fresh:
            if len(self._fresh) > 65536:  # a long run's live counts and cuts, bounded
                self._fresh.clear()
            self._fresh[key] = self._fresh_of(shape, n)
        return self._fresh[key]

    def _fresh_of(self, shape: Shape, n: int):
        job, S = shape.job, shape.stages
        if n < S:
            return None
        n = min(n, job.replicas * S)
        best, tried = None, set()
        options = [best_counts(job, n, chains)
                   for chains in ([None, [0] * S] if self.period else [None])]
        if shape.counts is not None and sum(shape.counts) == n:
            options.insert(0, list(shape.counts))
        for counts in options:
            if tuple(counts) in tried:
                continue
            tried.add(tuple(counts))
            failed = [(d, s) for d in range(job.replicas) for s in range(S) if d >= counts[s]]
            p = self.period(shape, failed) if self.period else count_bound(job, counts)
            if best is None or p < best[2]:
                best = (counts, failed, p)
        return best

    def best(self, n: int) -> Optional[tuple[Shape, int]]:
        """The least period of any shape on n workers, no transition counted: the limit."""
        out = None
        for shape in self.candidates(n):
            got = self.fresh(shape, n)
            if got is not None and (out is None or got[2] < out[1]):
                out = (shape, got[2])
        return out

    # ---- the choice ---------------------------------------------------------------
    def choose(self, current: Shape, live: Mapping[str, Optional[Slot]],
               horizon: float, current_period: Optional[Callable[[list[Slot]], int]] = None
               ) -> ShapeChoice:
        """The shape (and slots) for `live` workers (id -> slot of `current`, None for a
        fresh worker) worth most over `horizon` time units (module doc).
        `current_period`: the current shape's periods, if they differ from `period`'s
        (the simulator's carry the workers' speeds). NoRolesError if no shape fits."""
        n = len(live)
        options: list[ShapeOption] = []
        best = None  # (value, ShapeChoice)
        if n >= current.stages:
            cp = current_period or (None if self.period is None else
                                    (lambda failed: self.period(current, failed)))
            a = choose_roles(current.job, live, horizon, cp, snapshots=self.snapshots)
            v = expected_work(horizon, a.stall, a.period,
                              one_copy_stages(a.counts, self.snapshots), n)
            options.append(ShapeOption(current.stages, a.period, a.stall, v, True))
            best = (v, ShapeChoice(current, a.slots, a.moves, a.failed, a.counts, a.period,
                                   a.stall, False, ""))
        # every other shape with an optimistic worth: the family's on their proven least
        # periods (no stall), weighed first so that the bar is high when the fitted cuts'
        # weaker bounds (_fitted_bound, before the cut is made) are tested; each part in
        # falling worth, so the first that cannot win ends it
        family_part, fitted_part = [], []
        for shape in self.family:
            if n < shape.stages or (shape.bounds, shape.fixed) == (current.bounds, current.fixed):
                continue
            lb = elastic_bound(shape.job, min(n, shape.job.replicas * shape.stages))
            family_part.append((horizon / lb if lb > 0 else math.inf, shape))
        for counts in self.fitted_counts(n):
            lb = self._fitted_bound(counts)
            fitted_part.append((horizon / lb if lb > 0 else math.inf, counts))
        grouped = self._groups(current, live) if family_part or fitted_part else None
        seen = set()
        for part in (family_part, fitted_part):
            part.sort(key=lambda x: -x[0])
            for ub, shape in part:
                # what another shape must be worth: the current one's worth and the margin,
                # or the best other shape's; equal worth still competes (the tie rule)
                bar = -1.0 if best is None else \
                    best[0] * (1 + self.margin) if not best[1].changed else best[0]
                low = bar * (1 - 1e-12)
                if ub < low:
                    break
                if not isinstance(shape, Shape):  # a fitted cut, made now, then its bound
                    shape = self.fitted_shape(shape)
                    if shape is None or n < shape.stages or \
                            (shape.bounds == current.bounds and shape.fixed == current.fixed):
                        continue
                    if horizon / elastic_bound(shape.job, min(n, shape.job.replicas *
                                                              shape.stages)) < low:
                        continue
                key = (shape.bounds, shape.fixed, shape.counts)
                if key in seen:
                    continue
                seen.add(key)
                counts, failed, p = self.fresh(shape, n)
                if horizon / p < low:
                    continue  # even with no stall: its state moves need not be priced
                stall = self._transition(*grouped, shape, counts)[-1]
                v = expected_work(horizon, stall, p, one_copy_stages(counts, self.snapshots), n)
                options.append(ShapeOption(shape.stages, p, stall, v, False))
                # equal worth between other shapes: the smaller stall, then the deeper shape
                # (less state a worker, the nearer the user's); slots and moves are made for
                # the winner only (4,096 of each)
                tie = best is not None and best[1].changed and abs(v - bar) <= 1e-12 * max(v, bar)
                if (v > bar and not tie) or (tie and (-stall, shape.stages) > (
                        -best[1].stall, best[1].shape.stages)):
                    best = (v, ShapeChoice(shape, None, None, failed, counts, p, stall, True,
                                           ""))
        if best is None:
            raise NoRolesError(f"{n} live workers fit no shape of this job (the fewest "
                               f"stages it can run on is {min(s.stages for s in self.family)})")
        choice = best[1]
        if choice.changed:  # the winner's moves, now with the least largest stall
            flows, nbytes, lacking, snap, stall = self._transition(
                *grouped, choice.shape, choice.counts, exact=True)
            choice = dataclasses.replace(choice, stall=stall)
            slots, moves = self._assign(grouped[0], grouped[1], flows, nbytes, lacking, snap,
                                        choice.shape.stages)
            choice = ShapeChoice(choice.shape, slots, moves, choice.failed, choice.counts,
                                 choice.period, choice.stall, True, "")
        reason = ""
        if choice.changed:
            reason = self._reason(current, choice, options, n)
        return ShapeChoice(choice.shape, choice.slots, choice.moves, choice.failed,
                           choice.counts, choice.period, choice.stall, choice.changed,
                           reason, options)

    def _reason(self, current: Shape, choice: ShapeChoice, options, n: int) -> str:
        cur = next((o for o in options if o.current), None)
        moved = sum(m.bytes for m in choice.moves)
        tail = (f"; {len(choice.moves)} workers load {moved / 2**30:.3g} GiB, stall "
                f"{choice.stall}" if moved else "; no state to load (the job gives no "
                "state_bytes)" if self.job.state_bytes is None else "; nothing to load")
        if cur is None:
            return (f"{n} live workers cannot fill {current.stages} stages; period "
                    f"{choice.period} on {choice.shape.stages}{tail}")
        return (f"period {choice.period} against {cur.period} on {current.stages} stages"
                f"{tail}, repaid before the next event")

    def _groups(self, current: Shape, live: Mapping[str, Optional[Slot]]):
        """The live workers by current stage (the last group: fresh ones), and which units
        some live worker holds (what nobody holds comes from a snapshot)."""
        S0 = current.stages
        groups: list[list[str]] = [[] for _ in range(S0 + 1)]
        for w in sorted(live):
            slot = live[w]
            groups[S0 if slot is None else slot[1]].append(w)
        held = [*current.ranges(), None]
        covered = [False] * len(self.units.units)
        for g in range(S0):
            if groups[g]:
                for u in range(*held[g]):
                    covered[u] = True
        return groups, held, covered

    def _transition(self, groups, held, covered, shape: Shape, counts: list[int],
                    exact: bool = False):
        """How many workers of each current stage take each stage of `shape`
        (transition.py): (flows, bytes[g][k], lacking units[g][k], snapshot[k], stall).
        Candidates are screened on the flows of fewest bytes; `exact`: the least largest
        stall (the winner's, made once)."""
        st, bw, want, K = self._state, self.job.bandwidth, shape.ranges(), shape.stages
        G = len(groups)

        def time(b):
            return 0 if not bw or b <= 0 else int(math.ceil(b / bw))

        orphan = [sum(self.units.units[u].state_bytes for u in range(*want[k]) if not covered[u])
                  for k in range(K)]
        snap = [not all(covered[u] for u in range(*want[k])) for k in range(K)]
        nbytes = [[missing(st, held[g], want[k]) for k in range(K)] for g in range(G)]
        lacking = [[(d - c) - (0 if held[g] is None else
                               max(0, min(held[g][1], d) - max(held[g][0], c)))
                    for (c, d) in want] for g in range(G)]
        stall = [[time(nbytes[g][k]) if held[g] is not None else time(orphan[k])
                  for k in range(K)] for g in range(G)]
        # fewest bytes, then fewest units to load (what a spec without state_bytes leaves)
        cost = [[round(nbytes[g][k]) * 4096 + lacking[g][k] for k in range(K)]
                for g in range(G)]
        flows = transport([len(x) for x in groups], counts, stall, cost, bottleneck=exact)
        worst = max((stall[g][k] for g in range(G) for k in range(K)
                     if flows[g][k] and lacking[g][k] > 0), default=0)
        return flows, nbytes, lacking, snap, worst

    def _assign(self, groups, held, flows, nbytes, lacking, snap, K: int
                ) -> tuple[dict, list[Move]]:
        """The chosen shape's slots (packed: stage k in replicas 0..counts[k]-1) and moves:
        a worker that lacks units of its new stage loads them, even 0 bytes (a spec without
        state_bytes prices none; the runtime still loads)."""
        S0 = len(groups) - 1
        slots, moves, nxt = {}, [], [0] * K
        for g, ws in enumerate(groups):
            it = iter(ws)
            for k in range(K):
                for _ in range(flows[g][k]):
                    w = next(it)
                    slots[(nxt[k], k)] = w
                    nxt[k] += 1
                    if lacking[g][k] > 0:
                        moves.append(_move(w, None if g == S0 else g, k,
                                           int(round(nbytes[g][k])),
                                           "snapshot" if snap[k] else "peer"))
        return slots, moves


_MOVE_FIELDS = frozenset(("worker", "from_stage", "to_stage", "bytes", "source"))


def _move(worker: str, from_stage: Optional[int], to_stage: int, nbytes: int, source: str
          ) -> Move:
    """A Move from values made here (a live worker's id, stages of the grids, bytes the
    units hold), unvalidated, as planner.plan.make_action does for actions: a shape change
    at 4,096 workers names thousands (model_construct: 8 us each)."""
    m = object.__new__(Move)
    object.__setattr__(m, "__dict__", {"worker": worker, "from_stage": from_stage,
                                       "to_stage": to_stage, "bytes": nbytes, "source": source})
    object.__setattr__(m, "__pydantic_fields_set__", _MOVE_FIELDS)
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m
