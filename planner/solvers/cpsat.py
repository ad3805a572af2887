"""CP-SAT back-end: the exact model of docs/design.md section 4 for fixed routes, hinted by
greedy.

What makes it work (measured while this back-end was built): fixed-size intervals with one
no-overlap per worker, memory as a reservoir that presolve must not expand, the greedy
plan as a complete hint (with 2 workers CP-SAT has no first-solution search of its own),
micro-batch symmetry fixed, and the analytic lower bound on the objective variable.
Period propagates badly as an objective, so staggered mode minimises makespan first and
then period, hinted with the makespan plan. The result is never worse than the greedy hint.
Above a few hundred actions the global solve gets a third of the time and our own
large-neighbourhood search (planner/solvers/lns.py) the rest; failure-free jobs with identical
workers are solved for one replica and copied (`_one_replica`).
"""
from __future__ import annotations

import time
from typing import Optional

from ortools.sat.python import cp_model

from planner.bounds import lower_bound
from planner.failures import Worker, normalize
from planner.solvers.greedy import best_schedule, ranked_schedules, routed_schedule
from planner.policies import timeline_period
from planner.job import JobSpec
from planner.plan import Plan
from planner.routing import balanced_routes
from planner.solvers.schedmodel import (Actions, build_actions, canonical_starts, period_horizon,
                                slots_needed, starts_of, symmetry_chains, timeline_of)
from planner.solvers.timeline import Mode, Timeline, add_opt, finish_plan

_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE"}
# `time_limit` is spent as deterministic time (reproducible plans) at this rate: on the
# shared 2-core reference machine CP-SAT advanced 0.4 to 0.75 deterministic seconds per
# wall second, so the run then takes about `time_limit`. `time_limit` is also a wall-time
# limit on the whole call (a 1.5 x cap overran `--time-limit 10` by 30%): the solves stop
# at the deadline less the time kept for building the plan; a run that hits it is no
# longer reproducible.
_DET_PER_S = 0.5
# The period model spent 10 to 50 s of wall time before its first search step at 1.5K to
# 3K actions: ortools 9.15's TransitivePrecedencesEvaluator::ComputeFullPrecedences (found
# with perf), now off (`transitive_precedences_work_limit = 0`). Even so, at 1.5K+ actions
# the first interleaved batch (LP workers, scheduling_*_window LNS) runs 5 to 40 wall
# seconds for well under one deterministic second, so the re-solve overran the wall cap
# and lost to the makespan plan. Above this size period is not re-solved.
_PERIOD_MAX_ACTIONS = 1000
_WALL_CAP = 1.0
_WALL_RESERVE = 0.1  # of the limit, kept for what follows the last solve (plan, checks)
# Above this many actions the global model gets `_LNS_GLOBAL` of the time and our own LNS
# (planner/solvers/lns.py) the rest; it charges one deterministic unit per ~10 CPU seconds,
# spread over `num_workers` threads.
_LNS_MIN_ACTIONS = 300
_LNS_GLOBAL = 0.35
_LNS_DET_PER_S = 0.15
# With stragglers, CP-SAT shares its time among greedy's best routings, up to this many,
# whose greedy periods are within this fraction of the best one.
_ROUTINGS = 2
_ROUTE_TIE = 0.01


class _Model:
    """One CP-SAT model; `objective` is "makespan" or "period"."""

    def __init__(self, job: JobSpec, acts: Actions, chains: list[list[int]], objective: str,
                 horizon: int, obj_lb: int, obj_ub: int):
        m = self.m = cp_model.CpModel()
        n = len(acts)
        self.acts = acts
        dur, es, tail = acts.dur, acts.es, acts.tail
        # Domains from the chains: [earliest start, horizon - tail] prunes before search.
        self.start = [m.new_int_var(es[i], max(es[i], horizon - tail[i]), "") for i in range(n)]
        st = self.start
        for i in range(n):
            p = acts.pred[i]
            if p >= 0:
                m.add(st[i] >= st[p] + acts.lag[i])
        # A zero-length action still takes a unit slot in the no-overlap: CP-SAT would
        # otherwise place it inside another action, which a worker cannot run.
        for w, idx in acts.on.items():
            m.add_no_overlap([m.new_fixed_size_interval_var(st[i], max(1, dur[i]), "")
                              for i in idx])
        for ch in chains:
            for a, b in zip(ch, ch[1:]):
                m.add(st[b] >= st[a] + max(1, dur[a]))
        # Along a chain only the first F can be a worker's first action and only the last
        # release can be its stage's last: the others' OPT and span constraints are implied.
        not_first = {i for ch in chains for i in ch[1:]}
        not_last = {i for ch in chains for i in ch[:-1]}
        # Memory: +1 slot at F start, -1 at the release's end (W, or B when fused).
        for w, slots in slots_needed(job, acts).items():
            if slots is None:
                continue
            times, deltas = [], []
            for i in acts.on[w]:
                if acts.ops[i] == "F":
                    times.append(st[i]); deltas.append(1)
                elif acts.ops[i] == acts.release:
                    times.append(st[i] + dur[i]); deltas.append(-1)
            m.add_reservoir_constraint(times, deltas, 0, slots)
        # OPT of stage s: one start for all live peers, after every release of the stage.
        stages = sorted({s for _, s in acts.on})
        self.opt = {s: m.new_int_var(0, horizon, "") for s in stages}
        for i in range(n):
            if acts.ops[i] == acts.release and i not in not_last:
                m.add(self.opt[acts.stage[i]] >= st[i] + dur[i])
        self.obj = m.new_int_var(obj_lb, max(obj_lb, obj_ub), objective)
        opt_dur = {w: job.duration("OPT", *w) for w in acts.on}
        if objective == "makespan":
            for w in acts.on:
                m.add(self.obj >= self.opt[w[1]] + opt_dur[w])
            self.first = {}
        else:  # span of a worker: its OPT end minus its first action (always an F)
            self.first = {w: m.new_int_var(0, horizon, "") for w in acts.on}
            for w, idx in acts.on.items():
                for i in idx:
                    if acts.ops[i] == "F" and i not in not_first:
                        m.add(self.first[w] <= st[i])
                m.add(self.obj >= self.opt[w[1]] + opt_dur[w] - self.first[w])
        m.minimize(self.obj)

    def hint(self, job: JobSpec, starts: list[int]) -> None:
        """A complete hint: every start, the OPTs, the first actions and the objective."""
        acts, m = self.acts, self.m
        for v, t in zip(self.start, starts):
            m.add_hint(v, t)
        opt = {s: 0 for s in self.opt}
        for i, t in enumerate(starts):
            if acts.ops[i] == acts.release:
                opt[acts.stage[i]] = max(opt[acts.stage[i]], t + acts.dur[i])
        for s, v in self.opt.items():
            m.add_hint(v, opt[s])
        ends = {w: opt[w[1]] + job.duration("OPT", *w) for w in acts.on}
        if self.first:
            first = {w: min(starts[i] for i in idx) for w, idx in acts.on.items()}
            for w, v in self.first.items():
                m.add_hint(v, first[w])
            m.add_hint(self.obj, max(ends[w] - first[w] for w in acts.on))
        else:
            m.add_hint(self.obj, max(ends.values()))

    def solve(self, det_time: float, wall_cap: float, num_workers: int, seed: int):
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers = num_workers
        p.interleave_search = True
        p.random_seed = seed
        p.max_deterministic_time = max(0.01, det_time)
        p.max_time_in_seconds = max(0.01, wall_cap)  # safety cap only
        p.expand_reservoir_constraints = False
        # Building the transitive closure of the precedences (for the no-overlap
        # propagators) took 10 to 50 s of wall time, at no deterministic time, before the
        # first search step at 1.5K to 3K actions; the chains give it nothing new.
        p.transitive_precedences_work_limit = 0
        status = solver.solve(self.m)
        if status not in _STATUS:  # values after UNKNOWN are garbage
            return None, solver
        return [solver.value(v) for v in self.start], solver


def cpsat_plan(job: JobSpec, failed: list[Worker], mode: Mode = Mode(), time_limit: float = 10.0,
               num_workers: int = 2, seed: int = 0,
               routes: Optional[list[list[int]]] = None, use_bound: bool = True,
               hint: Optional[Timeline] = None, lns: Optional[bool] = None) -> Plan:
    """`use_bound=False` leaves the analytic lower bound out of the model, so an OPTIMAL
    status is CP-SAT's own proof (tests check the analytic bound against it). `hint`: a
    timeline (no OPTs) for these routes to start from when it beats the greedy portfolio,
    e.g. the greedy plan of another numbering of the same failed set. `lns`: improve the
    plan with planner/solvers/lns.py after the global solve (default: above _LNS_MIN_ACTIONS)."""
    t0 = time.perf_counter()
    failed = normalize(job, failed)
    if not failed and routes is None and hint is None and job.speed is None and job.replicas > 1:
        return _one_replica(job, mode, time_limit, num_workers, seed, use_bound, lns, t0)
    if routes is None and hint is None and job.speed is not None:
        ranked = ranked_schedules(job, failed, mode)
        close = [r for r in ranked[:_ROUTINGS] if r[0] <= ranked[0][0] * (1 + _ROUTE_TIE)]
        if len(close) > 1:
            return _best_routing(job, failed, mode, close, time_limit, num_workers, seed,
                                 use_bound, lns, t0)
    if routes is None:  # the greedy back-end's routing and plan: the hint, and the floor
        routes, greedy_tl = routed_schedule(job, failed, mode)
    else:
        greedy_tl = best_schedule(job, routes, mode)  # the best portfolio plan as the hint
    acts = build_actions(job, routes, mode)
    chains = symmetry_chains(job, routes, acts)

    if hint is not None and (timeline_period(job, hint, mode.staggered)
                             < timeline_period(job, greedy_tl, mode.staggered)):
        greedy_tl = {w: list(acts) for w, acts in hint.items()}
    g_starts = canonical_starts(acts, chains, starts_of(acts, greedy_tl))
    add_opt(job, greedy_tl)
    greedy = finish_plan(job, failed, routes, greedy_tl, mode, "cpsat", "HEURISTIC", 0.0)

    def plan_of(starts):
        tl = timeline_of(acts, starts)
        add_opt(job, tl)
        return finish_plan(job, failed, routes, tl, mode, "cpsat", "HEURISTIC", 0.0)

    lb_period, lb_makespan = 0, 0
    if use_bound:
        lb_period = lower_bound(job, failed, mode)
        lb_makespan = lower_bound(job, failed, Mode(mode.split_backward, staggered=False))
    budget = _DET_PER_S * time_limit
    deadline = t0 + _WALL_CAP * time_limit * (1 - _WALL_RESERVE)

    def solve(mdl, dt, wall_share):
        cap = max(0.0, deadline - time.perf_counter()) * wall_share
        return mdl.solve(dt, cap, num_workers, seed)

    # Zero-length actions take a unit slot in the model (see _Model), so the greedy plan
    # may not fit under its own makespan: z units of slack keep the model feasible (each
    # slot delays what follows by at most one). An infeasible model aborted the process
    # (ortools 9.15, 2 interleaved workers: "Check failed: heuristics.fixed_search").
    z = sum(1 for d in acts.dur if d == 0)
    g_make = greedy.metrics.makespan + z
    model = _Model(job, acts, chains, "makespan", g_make, lb_makespan, g_make)
    model.hint(job, g_starts)
    lns = len(acts) >= _LNS_MIN_ACTIONS if lns is None else lns
    share = 0.5 if mode.staggered and len(acts) <= _PERIOD_MAX_ACTIONS else 1.0
    share = _LNS_GLOBAL if lns else share
    starts, used = None, 0.0
    if share > 0:
        starts, solver = solve(model, budget * share, share)
        used = solver.deterministic_time
    best, bound = greedy, lb_period
    if starts is not None:
        cand = plan_of(starts)
        if cand.metrics.period <= best.metrics.period:
            best = cand
        if not mode.staggered:
            bound = max(bound, _floor(solver.best_objective_bound))
    if lns and best.metrics.period > lb_period:
        from planner.solvers.lns import improve
        from planner.validate import validate
        inc = canonical_starts(acts, chains, starts_of(acts, _as_timeline(best)))
        out = improve(job, acts, chains, inc, mode.staggered,
                      _LNS_DET_PER_S * time_limit * (1 - share), deadline, seed,
                      stop_at=lb_period, threads=num_workers)
        cand = plan_of(out)
        if cand.metrics.period < best.metrics.period and not validate(cand):
            best = cand
    elif mode.staggered and best.metrics.period > lb_period and len(acts) <= _PERIOD_MAX_ACTIONS:
        P = best.metrics.period + z
        model = _Model(job, acts, chains, "period", period_horizon(job, acts, P), lb_period, P)
        model.hint(job, canonical_starts(acts, chains, starts_of(acts, _as_timeline(best))))
        # Phase 1 may overrun its deterministic share; period still gets a fifth.
        starts, solver = solve(model, max(budget - used, 0.2 * budget), 1.0)
        if starts is not None:
            bound = max(bound, _floor(solver.best_objective_bound))
            cand = plan_of(starts)
            # Equal period: keep the makespan-optimised plan, it also ends sooner.
            if cand.metrics.period < best.metrics.period:
                best = cand
    if best is greedy:
        status = "HEURISTIC"
    else:
        status = "OPTIMAL" if best.metrics.period <= bound else "FEASIBLE"
    return best.model_copy(update={"solver": best.solver.model_copy(update={
        "status": status, "wall_s": round(time.perf_counter() - t0, 4), "bound": bound})})


def _best_routing(job, failed, mode, close, time_limit, num_workers, seed, use_bound, lns,
                  t0) -> Plan:
    """CP-SAT on each of greedy's near-best routings, the time shared: which routing lets
    the schedule close the gap shows only in the solve (on 8x8x8, two workers at 0.8 and a
    failure in their stage, greedy ties at 350 on two routings; CP-SAT gets 348 on one,
    344 on the other). The first is greedy's own, so the result never loses to greedy.
    Status and bound are the chosen routing's."""
    plans = [cpsat_plan(job, failed, mode, time_limit / len(close), num_workers, seed,
                        routes=routes, use_bound=use_bound, hint=tl, lns=lns)
             for _, routes, tl in close]
    best = min(plans, key=lambda p: p.metrics.period)  # ties: the earlier routing
    return best.model_copy(update={"solver": best.solver.model_copy(update={
        "wall_s": round(time.perf_counter() - t0, 4)})})


def _one_replica(job: JobSpec, mode: Mode, time_limit: float, num_workers: int, seed: int,
                 use_bound: bool, lns: Optional[bool], t0: float) -> Plan:
    """Without failures and with identical workers the replicas only meet at the stages'
    all-reduces: any plan restricted to one replica is a plan of the one-replica job whose
    OPTs start no later, and one replica's plan copied to all is a plan of the whole job
    with the same spans. So both optima are equal: solve one replica (D times fewer
    actions) and copy it."""
    sub = cpsat_plan(job.model_copy(update={"replicas": 1}), [], mode, time_limit,
                     num_workers, seed, use_bound=use_bound, lns=lns)
    M = job.microbatches
    tl = {(d, w.stage): [(a.op, a.microbatch, a.start, a.end) for a in w.actions
                         if a.op != "OPT"]
          for w in sub.workers for d in range(job.replicas)}
    tl = {(d, s): [(op, d * M + g, st, en) for op, g, st, en in acts]
          for (d, s), acts in tl.items()}
    add_opt(job, tl)
    plan = finish_plan(job, [], balanced_routes(job, []), tl, mode, "cpsat",
                       sub.solver.status, 0.0)
    bound = max(sub.solver.bound or 0, lower_bound(job, [], mode) if use_bound else 0)
    status = sub.solver.status
    if status != "HEURISTIC":
        status = "OPTIMAL" if plan.metrics.period <= bound else "FEASIBLE"
    return plan.model_copy(update={"solver": plan.solver.model_copy(update={
        "status": status, "wall_s": round(time.perf_counter() - t0, 4), "bound": bound})})


def _floor(x: float) -> int:
    return int(x + 1e-6)  # integral model: the bound is an integer up to float noise


def _as_timeline(plan: Plan):
    return {(w.replica, w.stage): [(a.op, a.microbatch, a.start, a.end) for a in w.actions
                                   if a.op != "OPT"] for w in plan.workers}
