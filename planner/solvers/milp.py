"""MILP back-end (PuLP + HiGHS): the CP-SAT model as a big-M disjunctive program.

An independent cross-check of CP-SAT on tiny jobs, not a production solver: CBC and HiGHS
stalled on D=2, S=4, M=8 for minutes where CP-SAT proves the optimum in under a second
(measured while the back-ends were built). It has no symmetry breaking, so it also checks CP-SAT's.

Per worker, one binary per pair of its actions (1: first before second), except where the
chains already fix the order (F before I before W of one micro-batch). Memory is exact: a
micro-batch h is held when F(g) starts iff F(h) runs before F(g) and F(g) before the
release of h, so the held set is counted at every F start, where the level peaks.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import pulp

from planner.bounds import lower_bound
from planner.failures import Worker, normalize
from planner.solvers.greedy import best_schedule, routed_schedule
from planner.job import JobSpec
from planner.plan import Plan
from planner.solvers.schedmodel import build_actions, period_horizon, slots_needed, timeline_of
from planner.solvers.timeline import Mode, add_opt, finish_plan

MAX_ACTIONS = 80


def milp_plan(job: JobSpec, failed: list[Worker], mode: Mode = Mode(), time_limit: float = 30.0,
              routes: Optional[list[list[int]]] = None) -> Plan:
    t0 = time.perf_counter()
    failed = normalize(job, failed)
    n = (3 if mode.split_backward else 2) * job.num_microbatches * job.stages
    if n > MAX_ACTIONS:
        raise ValueError(f"milp is a cross-check for tiny jobs: {n} actions > {MAX_ACTIONS}; "
                         f"use the cpsat back-end")
    # The routing and timeline the greedy back-end settles on (its whole portfolio, not only
    # the base rule): the start plan and the horizon. With the base rule's 14 as horizon
    # HiGHS once returned 14 as proven optimal where the portfolio had 13.
    if routes is None:
        routes, tl = routed_schedule(job, failed, mode)
    else:
        tl = best_schedule(job, routes, mode)
    acts = build_actions(job, routes, mode)
    add_opt(job, tl)
    greedy = finish_plan(job, failed, routes, tl, mode, "milp", "HEURISTIC", 0.0)
    lb = lower_bound(job, failed, mode)
    # Sync: no better plan ends after the greedy one. Staggered: see period_horizon.
    H = (period_horizon(job, acts, greedy.metrics.period) if mode.staggered
         else greedy.metrics.makespan)

    prob = pulp.LpProblem("recycle", pulp.LpMinimize)
    st = [prob.add_variable(f"s{i}", acts.es[i], max(acts.es[i], H - acts.tail[i]), cat="Integer")
          for i in range(n)]
    dur = acts.dur
    for i in range(n):
        if acts.pred[i] >= 0:
            prob += st[i] >= st[acts.pred[i]] + acts.lag[i]
    before: dict[tuple[int, int], object] = {}  # (i, j): 1 if i runs before j (or a constant)
    for w, idx in acts.on.items():
        for x, i in enumerate(idx):
            for j in idx[x + 1:]:
                if acts.mb[i] == acts.mb[j]:  # chain order: F, then I, then W
                    before[(i, j)], before[(j, i)] = 1, 0
                    continue
                y = prob.add_variable(f"y{i}_{j}", cat="Binary")
                before[(i, j)], before[(j, i)] = y, 1 - y
                # Zero-length actions still take a unit slot (a worker runs one at a time).
                prob += st[j] >= st[i] + max(1, dur[i]) - H * (1 - y)
                prob += st[i] >= st[j] + max(1, dur[j]) - H * y
    for w, slots in slots_needed(job, acts).items():
        if slots is None:
            continue
        fs = [i for i in acts.on[w] if acts.ops[i] == "F"]
        rel = {acts.mb[i]: i for i in acts.on[w] if acts.ops[i] == acts.release}
        for g_f in fs:
            held = []
            for h_f in fs:
                if h_f == g_f:
                    continue
                b = prob.add_variable(f"h{h_f}_{g_f}", 0, 1)
                prob += b >= before[(h_f, g_f)] + before[(g_f, rel[acts.mb[h_f]])] - 1
                held.append(b)
            prob += pulp.lpSum(held) + 1 <= slots
    stages = sorted({s for _, s in acts.on})
    opt = {s: prob.add_variable(f"opt{s}", 0, H) for s in stages}
    for i in range(n):
        if acts.ops[i] == acts.release:
            prob += opt[acts.stage[i]] >= st[i] + dur[i]
    obj = prob.add_variable("obj", lb, None)
    for w, idx in acts.on.items():
        end = opt[w[1]] + job.duration("OPT", *w)
        if mode.staggered:
            first = prob.add_variable(f"first{w[0]}_{w[1]}", 0, H)
            for i in idx:
                if acts.ops[i] == "F":
                    prob += first <= st[i]
            prob += obj >= end - first
        else:
            prob += obj >= end
    prob += obj

    solver = pulp.HiGHS(msg=False, timeLimit=time_limit, threads=1)
    prob.solve(solver)
    # PuLP says "Optimal" after a time-out that only holds a feasible point: read sol_status.
    kind = {pulp.LpSolutionOptimal: "OPTIMAL", pulp.LpSolutionIntegerFeasible: "FEASIBLE"}
    status = kind.get(prob.sol_status)
    bound = lb
    try:
        info = prob.solverModel.getInfo()
        if math.isfinite(info.mip_dual_bound):  # NaN or infinite when HiGHS has none
            bound = max(lb, int(info.mip_dual_bound + 1e-6))
    except AttributeError:
        pass
    if bound > greedy.metrics.period:  # a bound above a plan in hand is no bound
        bound = lb
    best = greedy
    if status is not None and all(v.varValue is not None for v in st):
        starts = [int(round(v.varValue)) for v in st]
        tl = timeline_of(acts, starts)
        add_opt(job, tl)
        cand = finish_plan(job, failed, routes, tl, mode, "milp", status, 0.0)
        if cand.metrics.period <= greedy.metrics.period:
            best = cand
    if best is greedy:
        status = "HEURISTIC"
    elif best.metrics.period <= bound:
        status = "OPTIMAL"
    metrics = best.metrics
    if status == "OPTIMAL" and bound > metrics.lower_bound:
        # Proven optimal (for this routing): the proof is the bound, so the gap is 0,
        # not the distance to the weaker analytic bound.
        metrics = metrics.model_copy(update={
            "lower_bound": bound, "gap": round(metrics.period / bound - 1, 6)})
    return best.model_copy(update={"metrics": metrics, "solver": best.solver.model_copy(update={
        "status": status, "wall_s": round(time.perf_counter() - t0, 4), "bound": bound})})
