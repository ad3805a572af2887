"""Roles: which live worker fills which slot (docs/design.md, "Roles").

The schedule is per slot (replica, stage); a role puts a live worker in a slot, and so
decides which slots are filled. When failures leave the stages unevenly served, moving a
worker from a well-served stage into the weakest one raises the rate (the period is set by
the stage whose workers carry the most micro-batches each). A move costs loading the
stage's parameters and optimizer state (`JobSpec.move_time`); it is worth it when the time
it saves before the next event (the horizon) exceeds the time it stalls.

`choose_roles` is pure: live workers with their current slots (None: a fresh worker with
no state) in, slots and moves out. The choice is made on `count_bound`, a proven lower
bound on the period of any plan whose stages have the given numbers of live workers
(whichever slots they fill), and checked, when a `period` function is given (the planner's
own period for a failed set), on the candidates' real periods.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, Optional

from planner.control.count_bounds import (  # noqa: F401 (re-exported: the roles API)
    NoRolesError, _chains, best_counts, count_bound, elastic_bound, need_count,
    stage_count_bound)
from planner.control.halt_risk import expected_work, one_copy_stages, with_home_margin
from planner.job import JobSpec
from planner.plan import Move, Role, home_id

Worker = tuple[int, int]


@dataclass(frozen=True)
class Assignment:
    slots: dict  # slot (replica, stage) -> the live worker that fills it
    moves: list[Move]  # workers that take a stage they do not hold
    failed: list[Worker]  # the empty slots: the failed set the schedule is planned for
    counts: list[int]  # live workers per stage
    period: int  # the chosen candidate's period (or its count bound, with no `period`)
    bound: int  # count_bound of the counts: no plan on these filled slots beats it
    stall: int  # time units the moves stall the job (loads run in parallel: the longest)
    candidates: list[tuple[int, int, int]] = field(default_factory=list)  # (moves, period, stall)

    @cached_property
    def roles(self) -> list[Role]:
        """One per live worker, sorted by slot (built when asked: the service's event path
        often needs none, and 4,096 of them cost milliseconds)."""
        return _roles(self.slots)

    @property
    def snapshot_stages(self) -> list[int]:
        return sorted({m.to_stage for m in self.moves if m.source == "snapshot"})


def failed_of(roles: list[Role], replicas: int, stages: int) -> list[Worker]:
    """The failed set a plan with these roles is planned for: every slot no role fills."""
    filled = {(r.replica, r.stage) for r in roles}
    return [(d, s) for d in range(replicas) for s in range(stages) if (d, s) not in filled]


def dead_of(roles: list[Role], replicas: int, stages: int) -> list[Worker]:
    """The dead workers under these roles: every home slot of the replicas x stages grid
    whose worker fills no slot (the slots may be of another shape's grid)."""
    filling = {r.worker for r in roles}
    return [(d, s) for d in range(replicas) for s in range(stages)
            if home_id(d, s) not in filling]


def identity_roles(job: JobSpec, failed) -> list[Role]:
    """The roles a plan without roles means: worker "r.s" in slot (r, s)."""
    dead = {tuple(f) for f in failed}
    return [Role(worker=f"{d}.{s}", replica=d, stage=s) for d in range(job.replicas)
            for s in range(job.stages) if (d, s) not in dead]


# ---- choosing -----------------------------------------------------------------------------
def _home(worker: str, job: JobSpec) -> Optional[Worker]:
    try:
        r, s = (int(x) for x in worker.split("."))
    except ValueError:
        return None
    return (r, s) if 0 <= r < job.replicas and 0 <= s < job.stages else None


def _targets(job: JobSpec, have: list[int], n: int, chains: list[int]) -> list[int]:
    """The counts with the least bound that keep as many workers where they are as
    possible: each stage gets what the optimum needs, the rest stay put, then go (fresh
    workers) where they lower the bound most."""
    S, D = job.stages, job.replicas
    opt = max(stage_count_bound(job, s, c, chains[s])
              for s, c in enumerate(best_counts(job, n, chains)))
    need = [need_count(job, s, opt, chains[s]) for s in range(S)]
    left = n - sum(need)
    out = list(need)
    for s in range(S):  # keep workers in place first
        add = min(left, max(0, min(have[s], D) - out[s]))
        out[s] += add
        left -= add
    while left > 0:
        open_ = [s for s in range(S) if out[s] < D]
        if not open_:
            break
        s = max(open_, key=lambda s: (stage_count_bound(job, s, out[s], chains[s]), -s))
        out[s] += 1
        left -= 1
    return out


def _stay_counts(job: JobSpec, have: list[int], homes: list[Optional[int]]) -> list[int]:
    """No worker changes stage but the ones an empty stage needs (forced: taken from the
    stage that loses least); fresh workers go home (`homes`: each one's home stage, None
    for none), the rest where they lower the bound most."""
    S, D = job.stages, job.replicas
    chains = _chains(job)
    out, rest = list(have), 0
    for h in homes:
        if h is not None and out[h] < D:
            out[h] += 1
        else:
            rest += 1
    for s in range(S):
        if out[s] == 0:
            if rest > 0:
                rest -= 1
            else:
                donors = [t for t in range(S) if out[t] > 1]
                t = min(donors, key=lambda t: (stage_count_bound(job, t, out[t] - 1, chains[t]), t))
                out[t] -= 1
            out[s] = 1
    while rest > 0:
        open_ = [s for s in range(S) if out[s] < D]
        s = max(open_, key=lambda s: (stage_count_bound(job, s, out[s], chains[s]), -s))
        out[s] += 1
        rest -= 1
    return out


def _path(job: JobSpec, start: list[int], target: list[int]) -> list[list[int]]:
    """Count vectors from `start` to `target`, one move at a time, each move the one that
    lowers the bound most (from a stage above its target to one below)."""
    chains = _chains(job)
    cur, out = list(start), [list(start)]
    while cur != target:
        gives = [s for s in range(job.stages) if cur[s] > target[s]]
        takes = [s for s in range(job.stages) if cur[s] < target[s]]
        to = max(takes, key=lambda s: (stage_count_bound(job, s, cur[s], chains[s]), -s))
        frm = min(gives, key=lambda s: (stage_count_bound(job, s, cur[s] - 1, chains[s]), s))
        cur[to] += 1
        cur[frm] -= 1
        out.append(list(cur))
    return out


def place(job: JobSpec, live: Mapping[str, Optional[Worker]], counts: list[int]
          ) -> tuple[list[Role], list[Move]]:
    """Slots for `counts`, packed into whole replicas: the replicas ranked by how many live
    workers they hold now, stage s is filled in the first counts[s] of them (so the empty
    slots gather in the last replicas: the planner's schedules are tighter that way, 403
    against 429 on a 16x8 grid with 26 slots empty). A worker that stays in its stage keeps
    its slot when that slot is kept, else takes a kept slot of its stage (a slot change
    within a stage moves no state: every replica of a stage holds the same parameters); a
    stage over its count gives up the workers outside its kept replicas first; movers and
    fresh workers take the kept slots still empty (a fresh worker its home slot first,
    else its home stage when that has room)."""
    roles_at, moves = _place(job, live, counts)
    return _roles(roles_at), moves


def _place(job: JobSpec, live: Mapping[str, Optional[Worker]], counts: list[int]
           ) -> tuple[dict[Worker, str], list[Move]]:
    """place's slots as {slot: worker}, in one pass over the workers per candidate (the
    service runs this on every event: 4,096 workers)."""
    S, D = job.stages, job.replicas
    fullness = [0] * D
    by_stage: list[list[str]] = [[] for _ in range(S)]
    fresh = []
    for w, slot in live.items():
        if slot is None:
            fresh.append(w)
        else:
            fullness[slot[0]] += 1
            by_stage[slot[1]].append(w)
    rank = sorted(range(D), key=lambda d: (-fullness[d], d))
    pos = {d: i for i, d in enumerate(rank)}  # replica d is kept for stage s iff pos < counts[s]
    roles_at: dict[Worker, str] = {}
    movers: list[tuple[str, Optional[int]]] = []
    for s in range(S):
        c = counts[s]
        ws = sorted(by_stage[s], key=lambda w: pos[live[w][0]])  # kept slots first
        stay = ws[:c]
        movers += [(w, s) for w in ws[c:]]
        held = {live[w][0] for w in stay}
        free = iter([d for d in rank[:c] if d not in held])
        for w in stay:
            d = live[w][0]
            roles_at[(d if pos[d] < c else next(free), s)] = w  # else re-slotted in its stage
    fresh.sort(key=lambda w: (_home(w, job) is None, w))
    moves: list[Move] = []
    had = [len(ws) for ws in by_stage]
    pending = []
    for w in fresh:
        home = _home(w, job)
        if home is not None and pos[home[0]] < counts[home[1]] and home not in roles_at:
            _take(job, w, None, home, roles_at, had, moves)
        else:
            pending.append((w, None))
    # the kept slots still empty, per stage in rank order; taken from the front
    empty = [[d for d in rank[:counts[s]] if (d, s) not in roles_at] for s in range(S)]
    chains = _chains(job)
    for w, frm in pending + movers:
        stages = [s for s in range(S) if empty[s]]
        if not stages:
            break
        home = _home(w, job) if frm is None else None
        if home is not None and home[1] in stages:
            s = home[1]  # a fresh worker goes home when its stage has room
        else:  # the wanting stage whose bound is highest now (where the worker helps most)
            s = max(stages, key=lambda s: (stage_count_bound(
                job, s, counts[s] - len(empty[s]), chains[s]), -s))
        _take(job, w, frm, (empty[s].pop(0), s), roles_at, had, moves)
    return roles_at, moves


def _roles(roles_at: dict[Worker, str]) -> list[Role]:
    """The roles of {slot: worker}, sorted by slot. Built unvalidated where the id is a
    valid WorkerId (the slots come from the grid): 4,096 validations cost 25 ms."""
    return [Role.model_construct(worker=w, replica=d, stage=s)
            if type(w) is str and 0 < len(w) <= 64 else Role(worker=w, replica=d, stage=s)
            for (d, s), w in sorted(roles_at.items())]


def _take(job, w, frm, slot, roles_at, had, moves) -> None:
    d, s = slot
    roles_at[slot] = w
    if frm != s:
        source = "peer" if had[s] > 0 else "snapshot"
        had[s] += 1
        nbytes = job.state_bytes[s] if job.state_bytes is not None else 0
        moves.append(Move(worker=w, from_stage=frm, to_stage=s, bytes=nbytes, source=source))


def move_stall(job: JobSpec, moves: list[Move]) -> int:
    """Time units the moves stall the job: workers that leave a stage (and any restore
    from a snapshot) load in parallel while nobody trains; a fresh worker loads from a
    live peer while the others still train (as a rejoin does), and stalls no one."""
    return max((job.move_time(m.to_stage) for m in moves
                if m.from_stage is not None or m.source == "snapshot"), default=0)


def choose_roles(job: JobSpec, live: Mapping[str, Optional[Worker]], horizon: float,
                 period: Optional[Callable[[list[Worker]], int]] = None,
                 snapshots: bool = False) -> Assignment:
    """The assignment of `live` workers (id -> current slot, None for a fresh worker) that
    trains most over `horizon` time units (the expected time to the next event): each
    candidate, from "no worker changes stage, fresh workers home" to the least-bound
    counts one move at a time, is worth its expected iterations over the horizon, the
    risk of a halt counted (halt_risk.py: a stage with one holder and, without
    `snapshots`, no copy in peer memory halts at that holder's death); one that sends a
    fresh worker away from home must be HOME_MARGIN better; ties go to fewer moves.
    `period` gives a failed set's period (default: the candidate's count bound, which
    needs no planning; the planner's periods are better and cost a plan each)."""
    S = job.stages
    slots = [v for v in live.values() if v is not None]
    if len(set(slots)) != len(slots):
        raise ValueError("two live workers in one slot")
    n = len(live)
    if n < S:
        raise NoRolesError(f"{n} live workers cannot serve {S} stages")
    have = [0] * S
    for _, s in slots:
        have[s] += 1
    homes = {w: _home(w, job) for w, slot in live.items() if slot is None}
    stay = _stay_counts(job, have, sorted((h[1] if h else None for h in homes.values()),
                                          key=lambda h: (h is None, h or 0)))
    paths = [_path(job, stay, _targets(job, have, n, _chains(job)))]
    if period is not None:
        # the count bound's round trips favour the early stages; the counts that balance
        # the work alone are tried too, on the planner's own periods
        paths.append(_path(job, stay, _targets(job, have, n, [0] * S))[1:])
    best, cands, seen = None, [], set()
    for counts in (c for path in paths for c in path):
        if tuple(counts) in seen:
            continue
        seen.add(tuple(counts))
        roles_at, moves = _place(job, live, counts)
        failed = [(d, s) for d in range(job.replicas) for s in range(S)
                  if (d, s) not in roles_at]
        bound = count_bound(job, counts)
        p = period(failed) if period is not None else bound
        stall = move_stall(job, moves)
        strays = sum(1 for (_, s), w in roles_at.items()
                     if w in homes and homes[w] is not None and homes[w][1] != s)
        value = with_home_margin(
            expected_work(horizon, stall, p, one_copy_stages(counts, snapshots), n), strays)
        shifted = sum(1 for m in moves if m.from_stage is not None)
        cands.append((shifted, p, stall))
        key = (shifted, strays)
        tie = best is not None and abs(value - best[0]) <= 1e-12 * max(value, best[0])
        if best is None or (value > best[0] and not tie) or (tie and key < best[2]):
            best = (value, (roles_at, moves, failed, counts, p, bound, stall), key)
    return Assignment(*best[1], cands)


def plan_roles(job: JobSpec, live: Mapping[str, Optional[Worker]], horizon: float,
               solver: str = "greedy", **solve_kw):
    """choose_roles (candidates compared on the greedy back-end's periods), then the plan
    of `solver` for the chosen filled slots, with its roles and moves. Returns (plan,
    assignment)."""
    from planner.simulation.costs import plan_period
    from planner.solvers.backends import solve

    a = choose_roles(job, live, horizon, lambda failed: plan_period(job, failed))
    plan = solve(job, a.failed, solver, **solve_kw)
    return plan.with_roles(a.roles, a.moves), a


def live_from_failed(job: JobSpec, failed, fresh: tuple[str, ...] = ()) -> dict[str, Optional[Worker]]:
    """The live workers of identity roles less `failed` (each in its home slot), plus
    `fresh` workers with no state."""
    dead = {tuple(f) for f in failed}
    live: dict[str, Optional[Worker]] = {f"{d}.{s}": (d, s) for d in range(job.replicas)
                                         for s in range(job.stages) if (d, s) not in dead}
    for w in fresh:
        if w in live:
            raise ValueError(f"worker {w} is already live")
        live[w] = None
    return live
