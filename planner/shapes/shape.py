"""Shapes a job can train in: a partition of its units and the job that partition makes.

A shape with S' stages is planned as an ordinary job (every back-end, the validator, roles
and the plan cache work on it unchanged): stage k's durations, activation memory and state
bytes are the sums over its units, a worker's memory less the parameters it holds is its
capacity, and its grid is R x S' with R * M' = D * M, so the global batch (D*M
micro-batches, the same samples) never changes. R is the fewest replicas (a divisor of
D*M) whose slots hold every worker of the job's own grid (R * S' >= D * S), so one shape
serves every live count and its plans are cached once; the slots no live worker fills are
empty and their micro-batches are re-routed, as a failed worker's are.

Every pipeline of a shape has the same depth S': a micro-batch detours to another
replica's worker of the same stage only if that worker holds the same units, and a
stage's all-reduce joins the workers that hold them, so the schedule model (docs/design.md
section 4) needs one unit range per stage. What unequal depths buy Oobleck (using n
workers when S' does not divide n) the re-routing buys here: the extra workers of a stage
take micro-batches from its others.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from planner.job import Cost, JobSpec, Memory
from planner.shapes.partition import Bounds, Partition, balance, minimax, ranges
from planner.shapes.units import Units


@dataclass(frozen=True)
class Shape:
    bounds: Bounds  # stage k runs units bounds[k] .. bounds[k+1] - 1
    job: JobSpec  # the job of this shape (the base job itself for its own partition)
    fixed: bool  # the job's own partition
    counts: Optional[tuple[int, ...]] = None  # the live counts a fitted cut was made for

    @property
    def stages(self) -> int:
        return len(self.bounds) - 1

    def ranges(self) -> list[tuple[int, int]]:
        return ranges(self.bounds)

    def partition(self, base: JobSpec, units: Units) -> Optional[Partition]:
        """What a plan of this shape carries (None: the job's own partition)."""
        if self.fixed:
            return None
        return Partition(unit=units.kind, bounds=list(self.bounds), base=base.identity_hash())


def replicas_for(base: JobSpec, stages: int) -> int:
    """R of a shape of `stages` stages (module doc)."""
    DM, need = base.num_microbatches, base.replicas * base.stages
    return next((r for r in range(1, DM + 1) if DM % r == 0 and r * stages >= need), DM)


def shaped_job(base: JobSpec, units: Units, bounds: Bounds) -> Optional[JobSpec]:
    """The job of a shape (module doc); None if some stage does not fit a worker."""
    groups = [units.units[i:j] for i, j in ranges(bounds)]
    if any(not units.fits(i, j) for i, j in ranges(bounds)):
        return None
    S = len(groups)
    R = replicas_for(base, S)
    sums = {op: [max(0, round(sum(getattr(u, op) for u in g))) for g in groups]
            for op in ("F", "I", "W", "OPT")}
    memory = None
    if units.capacity is not None:
        act = [max(1, round(sum(u.activation for u in g))) for g in groups]
        cap = [int(units.capacity - sum(u.params for u in g)) for g in groups]
        if any(c < a for a, c in zip(act, cap)):
            return None
        memory = Memory(activation=act, capacity=cap)
    state = None
    if base.state_bytes is not None or any(u.state_bytes for u in units.units):
        state = [round(sum(u.state_bytes for u in g)) for g in groups]
    return JobSpec(replicas=R, stages=S, microbatches=base.num_microbatches // R,
                   cost=Cost(**sums), p2p=base.p2p, memory=memory, state_bytes=state,
                   bandwidth=base.bandwidth)


_FAMILIES: dict = {}  # (id of the job, id of the units) -> (job, units, shapes): a few jobs


def family(base: JobSpec, units: Units) -> list[Shape]:
    """Every shape the planner considers for `base`: its own partition first, then for
    each S' from S down to units.min_stages the balanced partition (partition.balance)
    that fits a worker, unless it is the job's own. Pipelines are never deeper than the
    job's (more stages than the user asked for only add bubbles and messages on the
    same workers). Memoised per job."""
    key = (id(base), id(units))
    hit = _FAMILIES.get(key)
    if hit is not None and hit[0] is base and hit[1] is units:
        return hit[2]
    out = [Shape(tuple(units.fixed), base, True)]
    work = [u.work for u in units.units]
    for S in range(min(base.stages, len(units.units)), max(1, units.min_stages) - 1, -1):
        bounds = balance(work, S, units.fits)
        if bounds is None or bounds == tuple(units.fixed):
            continue
        job = shaped_job(base, units, bounds)
        if job is not None:
            out.append(Shape(bounds, job, False))
    if len(_FAMILIES) >= 16:
        _FAMILIES.pop(next(iter(_FAMILIES)))
    _FAMILIES[key] = (base, units, out)
    return out


def fitted(base: JobSpec, units: Units, counts: tuple[int, ...]) -> Optional[Bounds]:
    """The cut of the units into len(counts) stages for stage k served by counts[k]
    workers: the largest lower bound on a stage's span (planner/bounds.py's span bound:
    its workers' share of the D*M micro-batches, the round trip through the later stages,
    its memory slots, its optimizer step) is least. A stage with one worker more takes
    more units: n workers that S' does not divide are all used, as pipelines of unequal
    depth would use them. None if no cut fits a worker."""
    DM = base.num_microbatches
    # the cut depends on the counts only through each stage's share of the micro-batches:
    # live counts that give the same shares (most, at thousands of workers) share it
    shares = tuple(-(-DM // c) for c in counts)
    key = (id(base), id(units), shares)
    hit = _FITTED.get(key)
    if hit is not None and hit[0] is base and hit[1] is units:
        return hit[2]
    got = _fitted(base, units, shares)
    if len(_FITTED) >= 4096:
        _FITTED.clear()
    _FITTED[key] = (base, units, got)
    return got


_FITTED: dict = {}


def _fitted(base: JobSpec, units: Units, shares: tuple[int, ...]) -> Optional[Bounds]:
    us, K = units.units, len(shares)
    n = len(us)
    pre = {k: [0.0] for k in ("F", "I", "W", "OPT", "activation", "params")}
    for u in us:
        for k, acc in pre.items():
            acc.append(acc[-1] + getattr(u, k))
    fi_total = pre["F"][n] + pre["I"][n]
    hop = min(base.p2p.intra, base.p2p.cross)
    cap = units.capacity

    def span(k: int, i: int, j: int) -> Optional[float]:
        f, b, w, opt = (pre[x][j] - pre[x][i] for x in ("F", "I", "W", "OPT"))
        m = shares[k]
        chain = fi_total - (pre["F"][j] + pre["I"][j]) + 2 * hop * (K - 1 - k)
        slots = None
        if cap is not None:
            act = pre["activation"][j] - pre["activation"][i]
            room = cap - (pre["params"][j] - pre["params"][i])
            if room < max(act, 1e-9):
                return None
            slots = math.floor(room / act) if act > 0 else None
        held = m if slots is None else min(m, slots)
        work = m * (f + b + w) + max(0.0, f + chain - held * f, chain - (held - 1) * (b + w))
        if slots is not None:
            work = max(work, m * (f + chain + b + w) / slots)
        return work + opt

    def own(k: int, i: int, j: int) -> float:  # the stage's work and step: grows with j
        F, I_, W, O = pre["F"], pre["I"], pre["W"], pre["OPT"]
        return shares[k] * (F[j] - F[i] + I_[j] - I_[i] + W[j] - W[i]) + O[j] - O[i]

    got = minimax(n, K, span, own)
    return None if got is None else got[0]
