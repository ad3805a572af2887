"""The role rule as first written (planner/control/roles.py at 9963de4, the commit that
added the risk of a halt): plain loops, no heap, no bisection, no memo of the best
counts, a Role built per candidate. The oracle tests/test_roles_fast.py holds the fast
path to: the same roles, moves and counts on random memberships. Not used by the product."""
from __future__ import annotations

from typing import Callable, Mapping, Optional

from planner.control.halt_risk import expected_work, one_copy_stages, with_home_margin
from planner.control.roles import (NoRolesError, _chains, _home, count_bound,
                                   failed_of, move_stall, stage_count_bound)
from planner.job import JobSpec
from planner.plan import Move, Role

Worker = tuple[int, int]


def best_counts(job: JobSpec, n: int, chains: Optional[list[int]] = None) -> list[int]:
    S, D = job.stages, job.replicas
    if n < S:
        raise NoRolesError(f"{n} live workers cannot serve {S} stages")
    chains = _chains(job) if chains is None else chains
    counts = [1] * S
    for _ in range(min(n, S * D) - S):
        open_ = [s for s in range(S) if counts[s] < D]
        s = max(open_, key=lambda s: (stage_count_bound(job, s, counts[s], chains[s]), -s))
        counts[s] += 1
    return counts


def _targets(job: JobSpec, have: list[int], n: int, chains: list[int]) -> list[int]:
    S, D = job.stages, job.replicas
    opt = max(stage_count_bound(job, s, c, chains[s])
              for s, c in enumerate(best_counts(job, n, chains)))
    need = []
    for s in range(S):
        c = 1
        while stage_count_bound(job, s, c, chains[s]) > opt:
            c += 1
        need.append(c)
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
    S, D = job.stages, job.replicas
    fullness = [0] * D
    for slot in live.values():
        if slot is not None:
            fullness[slot[0]] += 1
    rank = sorted(range(D), key=lambda d: (-fullness[d], d))
    keep = {s: set(rank[:counts[s]]) for s in range(S)}
    roles_at: dict[Worker, str] = {}
    movers: list[tuple[str, Optional[int]]] = []
    for s in range(S):
        ws = sorted((w for w, slot in live.items() if slot is not None and slot[1] == s),
                    key=lambda w: (live[w][0] not in keep[s], rank.index(live[w][0]), w))
        stay, leave = ws[:counts[s]], ws[counts[s]:]
        movers += [(w, s) for w in leave]
        free = [d for d in rank[:counts[s]] if (d, s) not in {live[w] for w in stay}]
        for w in stay:
            d = live[w][0]
            if d not in keep[s]:
                d = free.pop(0)  # re-slotted within its stage
            roles_at[(d, s)] = w
    fresh = sorted((w for w, slot in live.items() if slot is None),
                   key=lambda w: (_home(w, job) is None, w))
    moves: list[Move] = []
    had = {s: sum(1 for slot in live.values() if slot is not None and slot[1] == s)
           for s in range(S)}
    open_slots = lambda s: [d for d in rank[:counts[s]] if (d, s) not in roles_at]
    pending = []
    for w in fresh:
        home = _home(w, job)
        if home is not None and home[0] in keep[home[1]] and home not in roles_at:
            _take(job, w, None, home, roles_at, had, moves)
        else:
            pending.append((w, None))
    chains = _chains(job)
    for w, frm in pending + movers:
        stages = [s for s in range(S) if open_slots(s)]
        if not stages:
            break
        home = _home(w, job) if frm is None else None
        if home is not None and home[1] in stages:
            s = home[1]  # a fresh worker goes home when its stage has room
        else:  # the wanting stage whose bound is highest now (where the worker helps most)
            filled = {s: sum(1 for (_, t) in roles_at if t == s) for s in stages}
            s = max(stages, key=lambda s: (stage_count_bound(job, s, filled[s], chains[s]), -s))
        _take(job, w, frm, (open_slots(s)[0], s), roles_at, had, moves)
    roles = sorted((Role(worker=w, replica=d, stage=s) for (d, s), w in roles_at.items()),
                   key=lambda r: (r.replica, r.stage))
    return roles, moves


def _take(job, w, frm, slot, roles_at, had, moves) -> None:
    d, s = slot
    roles_at[slot] = w
    if frm != s:
        source = "peer" if had[s] > 0 else "snapshot"
        had[s] += 1
        nbytes = job.state_bytes[s] if job.state_bytes is not None else 0
        moves.append(Move(worker=w, from_stage=frm, to_stage=s, bytes=nbytes, source=source))


def choose_roles(job: JobSpec, live: Mapping[str, Optional[Worker]], horizon: float,
                 period: Optional[Callable[[list[Worker]], int]] = None,
                 snapshots: bool = False) -> tuple:
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
        roles, moves = place(job, live, counts)
        failed = failed_of(roles, job.replicas, S)
        bound = count_bound(job, counts)
        p = period(failed) if period is not None else bound
        stall = move_stall(job, moves)
        strays = sum(1 for r in roles if r.worker in homes and homes[r.worker] is not None
                     and homes[r.worker][1] != r.stage)
        value = with_home_margin(
            expected_work(horizon, stall, p, one_copy_stages(counts, snapshots), n), strays)
        shifted = sum(1 for m in moves if m.from_stage is not None)
        cands.append((shifted, p, stall))
        key = (shifted, strays)
        tie = best is not None and abs(value - best[0]) <= 1e-12 * max(value, best[0])
        if best is None or (value > best[0] and not tie) or (tie and key < best[2]):
            best = (value, (roles, moves, failed, counts, p, bound, stall), key)
    return best[1]  # roles, moves, failed, counts, period, bound, stall
