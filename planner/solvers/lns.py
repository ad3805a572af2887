"""Large-neighbourhood search driven by us, for jobs where CP-SAT's own search stalls.

At 1.5K to 3K actions CP-SAT's first interleaved round (LP workers, its scheduling LNS)
costs 5 to 45 s of wall time for under one deterministic second, so a 10 s run barely
leaves the greedy hint. Here every step solves a small CP-SAT model instead:

  - a neighbourhood: the actions of some workers (all, or a run of stages) that start in
    a time window [t0, t1) of the incumbent, chosen by a seeded RNG; 40% of the windows end
    at the makespan (with a failure every stage-0 worker is critical, and only the tail
    of all workers together moves their last W);
  - actions that start before t0 keep their times (constants);
  - the window's actions are free: intervals in one no-overlap per worker, memory as a
    reservoir that starts at the level the fixed actions leave;
  - every later action keeps its worker's order (a chain after the window's last action)
    but floats, so gains in the window propagate to the end as a left shift. Memory needs
    no constraint there: on one worker the order of F starts and release ends follows the
    worker's sequence, so the level after the window is the incumbent's.

The incumbent is a complete hint of every neighbourhood model, so a step never gets worse.
The objective is the period (or makespan), then the sum of OPT starts as a tie-break that
keeps the schedule compact (plateau moves; the sum of every worker's last release end
instead, to let tails move one worker at a time, did worse).
A round solves `threads` neighbourhoods at once (one CP-SAT worker each, LP off: it cost
10x the time and found nothing) and keeps the best. The window size adapts (larger after
proofs, smaller after time-outs). The loop charges CP-SAT's deterministic time plus a
per-variable cost for building each model in Python, so a run is reproducible while the
wall-clock cap is not hit. On these models CP-SAT runs ~10 to 15 CPU seconds per
deterministic second.
"""
from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from ortools.sat.python import cp_model

from planner.job import JobSpec
from planner.solvers.schedmodel import Actions, slots_needed

# Deterministic seconds charged per model variable for building a neighbourhood model in
# Python (about its wall cost on the reference machine, relative to CP-SAT's det. time).
_BUILD_DET = 2e-5
# Share of windows that end at the makespan.
_END_SHARE = 0.4


def evaluate(job: JobSpec, acts: Actions, starts: list[int], staggered: bool) -> tuple[int, int]:
    """(objective, sum of OPT starts) of a schedule; objective = period or makespan."""
    last = {w: max(starts[i] + acts.dur[i] for i in idx if acts.ops[i] == acts.release)
            for w, idx in acts.on.items()}
    opt: dict[int, int] = {}
    for (d, s), t in last.items():
        opt[s] = max(opt.get(s, 0), t)
    ends = {w: opt[w[1]] + job.duration("OPT", *w) for w in acts.on}
    if staggered:
        obj = max(ends[w] - min(starts[i] for i in idx) for w, idx in acts.on.items())
    else:
        obj = max(ends.values())
    return obj, sum(opt.values())


class _Step:
    """One neighbourhood model: `window` free, earlier actions fixed, later ones in order."""

    def __init__(self, job: JobSpec, acts: Actions, chains: list[list[int]],
                 starts: list[int], window: set[int], t0: int, horizon: int,
                 staggered: bool, slots: dict):
        m = self.m = cp_model.CpModel()
        n = len(acts)
        dur = acts.dur
        fixed = [starts[i] < t0 for i in range(n)]
        self.var: dict[int, cp_model.IntVar] = {}
        lb_worker: dict = {}
        for w, idx in acts.on.items():
            lb_worker[w] = max([starts[i] + max(1, dur[i]) for i in idx if fixed[i]],
                               default=0)
        for i in range(n):
            if not fixed[i]:  # after the worker's fixed actions and a fixed predecessor
                p = acts.pred[i]
                lo = max(acts.es[i], lb_worker[acts.worker[i]], t0 if i in window else 0,
                         starts[p] + acts.lag[i] if p >= 0 and fixed[p] else 0)
                hi = max(lo, horizon - acts.tail[i])
                self.var[i] = m.new_int_var(lo, hi, "")
        v = self.var

        def x(i):
            return v[i] if i in v else starts[i]

        for i in v:
            p = acts.pred[i]
            if p in v:
                m.add(v[i] >= v[p] + acts.lag[i])
        for ch in chains:
            for a, b in zip(ch, ch[1:]):
                if a in v or b in v:
                    m.add(x(b) >= x(a) + max(1, dur[a]))
        for w, idx in acts.on.items():
            win = [i for i in idx if i in window]
            rest = sorted((i for i in idx if i in v and i not in window),
                          key=lambda i: starts[i])
            if len(win) > 1:
                m.add_no_overlap([m.new_fixed_size_interval_var(v[i], max(1, dur[i]), "")
                                  for i in win])
            if rest:
                for i in win:
                    m.add(v[rest[0]] >= v[i] + max(1, dur[i]))
                for a, b in zip(rest, rest[1:]):
                    m.add(v[b] >= v[a] + max(1, dur[a]))
            cap = slots.get(w)
            if cap is not None and win:
                level = sum(1 for i in idx if fixed[i] and acts.ops[i] == "F") - sum(
                    1 for i in idx if fixed[i] and acts.ops[i] == acts.release)
                times, deltas = [], []
                for i in win:
                    if acts.ops[i] == "F":
                        times.append(v[i]); deltas.append(1)
                    elif acts.ops[i] == acts.release:
                        times.append(v[i] + dur[i]); deltas.append(-1)
                if times:
                    if level:
                        times.append(max(0, t0 - 1)); deltas.append(level)
                    m.add_reservoir_constraint(times, deltas, 0, cap)
        # last[w]: the end of w's last release; the stage's OPT waits for all of them.
        stages = sorted({s for _, s in acts.on})
        self.opt = {s: m.new_int_var(0, horizon, "") for s in stages}
        last, cur_opt = {}, {s: 0 for s in stages}
        for w, idx in acts.on.items():
            rel = [i for i in idx if acts.ops[i] == acts.release]
            cur = max(starts[i] + dur[i] for i in rel)
            cur_opt[w[1]] = max(cur_opt[w[1]], cur)
            lo = max([starts[i] + dur[i] for i in rel if i not in v], default=0)
            free = [i for i in rel if i in window]
            tail_rel = [i for i in rel if i in v and i not in window]
            if tail_rel:
                free.append(max(tail_rel, key=lambda i: starts[i]))
            if not free:
                last[w] = lo
                m.add(self.opt[w[1]] >= lo)
                continue
            last[w] = m.new_int_var(lo, max(lo, horizon), "")
            for i in free:
                m.add(last[w] >= v[i] + dur[i])
            m.add(self.opt[w[1]] >= last[w])
            m.add_hint(last[w], cur)
        obj = m.new_int_var(0, horizon, "")
        for w, idx in acts.on.items():
            end = self.opt[w[1]] + job.duration("OPT", *w)
            if not staggered:
                m.add(obj >= end)
                continue
            fixed_first = [starts[i] for i in idx if fixed[i]]
            if fixed_first:
                m.add(obj >= end - min(fixed_first))
            else:
                first = m.new_int_var(0, horizon, "")
                for i in idx:
                    if acts.ops[i] == "F":
                        m.add(first <= v[i])
                m.add(obj >= end - first)
                m.add_hint(first, min(starts[i] for i in idx))
        self.obj = obj
        m.minimize(obj * (len(self.opt) * (horizon + 1)) + sum(self.opt.values()))
        for i, var in v.items():
            m.add_hint(var, starts[i])
        for s, var in self.opt.items():
            m.add_hint(var, cur_opt[s])

    def solve(self, det: float, wall: float, seed: int):
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers = 1
        p.random_seed = seed
        p.max_deterministic_time = det
        p.max_time_in_seconds = max(0.01, wall)
        p.expand_reservoir_constraints = False
        p.transitive_precedences_work_limit = 0
        p.linearization_level = 0  # the LP costs 10x the wall time here and finds nothing
        status = solver.solve(self.m)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None, solver, status
        return {i: solver.value(x) for i, x in self.var.items()}, solver, status


def improve(job: JobSpec, acts: Actions, chains: list[list[int]], starts: list[int],
            staggered: bool, det_budget: float, deadline: float, seed: int = 0,
            step_det: float = 0.25, target: int = 200,
            stop_at: int = 0, threads: int = 2, log: Optional[list] = None) -> list[int]:
    """Best schedule found from `starts` (a valid, canonical schedule) within `det_budget`
    deterministic seconds (or the wall `deadline`, a safety cap), or once the objective
    reaches `stop_at` (a lower bound)."""
    rng = random.Random(seed)
    slots = slots_needed(job, acts)
    best = list(starts)
    score = evaluate(job, acts, best, staggered)
    spent, it = 0.0, 0
    stages = sorted({s for _, s in acts.on})
    n = len(acts)
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    while spent < det_budget and time.perf_counter() < deadline and score[0] > stop_at:
        c0 = time.process_time()
        order = sorted(range(n), key=lambda i: best[i])
        horizon = max(best[i] + acts.tail[i] for i in range(n))
        steps = []
        for _ in range(threads):
            it += 1
            window, t0 = _neighbourhood(rng, acts, best, order, stages, min(n, target))
            if window:
                steps.append((it, _Step(job, acts, chains, best, window, t0, horizon,
                                        staggered, slots)))
        det = min(step_det, max(0.01, det_budget - spent))
        wall = deadline - time.perf_counter()
        if pool is None:
            results = [st.solve(det, wall, seed + k) for k, st in steps]
        else:
            results = list(pool.map(lambda ks: ks[1].solve(det, wall, seed + ks[0]), steps))
        grow = False
        for (k, st), (vals, solver, status) in zip(steps, results):
            spent += solver.deterministic_time + _BUILD_DET * len(st.var)
            grow = grow or status == cp_model.OPTIMAL
            if vals is not None:
                cand = list(best)
                for i, t in vals.items():
                    cand[i] = t
                sc = evaluate(job, acts, cand, staggered)
                if sc <= score:
                    best, score = cand, sc
            if log is not None:
                log.append((k, len(st.var), round(solver.deterministic_time, 3),
                            round(time.process_time() - c0, 3), solver.status_name(status),
                            score))
        target = min(int(target * 1.15) + 1, 1500) if grow else max(60, int(target * 0.85))
    if pool is not None:
        pool.shutdown()
    return best


def _neighbourhood(rng: random.Random, acts: Actions, best: list[int], order: list[int],
                   stages: list[int], k: int) -> tuple[set[int], int]:
    """The actions starting in a window [t0, t1) on all workers or a run of stages."""
    if rng.random() < _END_SHARE:  # the tail: where every stage's last W waits
        a = len(order) - k
    else:
        a = rng.randrange(0, max(1, len(order) - k // 2))
    t0 = best[order[max(0, a)]]
    t1 = best[order[min(len(order) - 1, a + k)]] + 1
    keep = set(stages)
    if rng.random() < 0.5 and len(stages) > 2:  # a run of stages, a longer window
        span = max(2, len(stages) // 2)
        s0 = rng.randrange(0, len(stages) - span + 1)
        keep = set(stages[s0:s0 + span])
        t1 = t0 + 2 * (t1 - t0)
    return {i for i in range(len(acts)) if t0 <= best[i] < t1 and acts.stage[i] in keep}, t0
