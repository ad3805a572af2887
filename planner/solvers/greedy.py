"""Event-driven list scheduling: the fast back-end, and the 1F1B baseline as a policy of it.

Each worker, whenever it is free, runs the best action that is ready:
  1. `I` (or fused `B`): it is on the critical path back to stage 0;
  2. `F`, if the worker has memory for one more micro-batch (and, for 1F1B, fewer than
     S - s in flight);
  3. a deferred `W`: weight gradients fill time that would otherwise be a bubble.
A worker with nothing ready waits for the next arrival. Decisions are taken in global time
order, so everything that can be ready at time t is known at t. The run is deterministic
and O(actions log actions): D=64 x S=16 x M=64 (~200K actions) takes about a second.
`Policy` (planner/policies.py) varies that order; `greedy_plan` runs a small portfolio of
policies on jobs small enough and keeps the best plan.
"""
from __future__ import annotations

import heapq
import time
from collections import deque
from typing import Optional

from planner.failures import Worker, normalize
from planner.job import JobSpec
from planner.plan import Plan
from planner.policies import BASE, PORTFOLIO, PORTFOLIO_BUDGET, Policy, timeline_period
from planner.routing import assignment, balanced_routes, route_candidates
from planner.solvers.timeline import Mode, Timeline, add_opt, finish_plan

INF = 1 << 60


def list_schedule(job: JobSpec, routes: list[list[int]], mode: Mode,
                  inflight: Optional[list[int]] = None, policy: Policy = BASE) -> Timeline:
    """Timeline of F/I/W (or F/B) for fixed routes; `inflight[s]` optionally caps how many
    micro-batches a stage-s worker holds at once, on top of its memory."""
    S = job.stages
    owned = assignment(job, routes)
    keys = sorted(owned)
    wid = {k: i for i, k in enumerate(keys)}
    n = len(keys)
    stage = [s for _, s in keys]
    dur = {op: [job.duration(op, d, s) for d, s in keys] for op in ("F", "I", "W", "B")}
    slots = []
    for d, s in keys:
        cap = job.slots(s)
        cap = INF if cap is None else cap
        if inflight is not None:
            cap = min(cap, inflight[s])
        slots.append(cap)
    caps = policy.caps(job)
    fcap = [INF if caps is None else caps[s] for _, s in keys]
    f_first = [policy.f_before_i(s) for _, s in keys]
    wblock, fit, fit_f, by_m = policy.wblock, policy.fit, policy.fit_f, policy.fkey == "m"
    # Among equally ready F's, a micro-batch's index within its own replica decides:
    # adopted micro-batches then reach the rest of their pipeline at that pipeline's pace.
    M = job.microbatches
    back = "I" if mode.split_backward else "B"
    dur_back, dur_f, dur_w = dur[back], dur["F"], dur["W"]
    qF: list[list] = [[] for _ in range(n)]
    qI: list[list] = [[] for _ in range(n)]
    qW: list[deque] = [deque() for _ in range(n)]
    rF: list[list] = [[] for _ in range(n)]  # arrived F's by replica index (fkey "m")
    held = [0] * n
    fwd = [0] * n  # micro-batches between F and I
    free_at = [0] * n
    out: list[list] = [[] for _ in range(n)]
    route_w = [[wid[(d, s)] for s, d in enumerate(row)] for row in routes]
    route_d = routes
    intra, cross = job.p2p.intra, job.p2p.cross
    events: list = []
    push, pop = heapq.heappush, heapq.heappop

    for g in range(len(routes)):
        w = route_w[g][0]
        push(qF[w], (0, g % M, g))
    for w in range(n):
        if qF[w]:
            push(events, (0, w))

    while events:
        t, w = pop(events)
        if free_at[w] > t:
            continue
        qi, qf = qI[w], qF[w]
        if by_m:
            while qf and qf[0][0] <= t:
                push(rF[w], pop(qf)[1:])
            ready_f = bool(rF[w])
        else:
            ready_f = bool(qf) and qf[0][0] <= t
        ready_i = bool(qi) and qi[0][0] <= t
        room = held[w] < slots[w]
        ok_f = ready_f and room and fwd[w] < fcap[w]
        if wblock and ready_f and not room and qW[w]:
            op = "W"  # before an I: the W frees the slot a waiting F needs
        elif ready_i and not (ok_f and f_first[w]):
            op = back
        elif ok_f:
            op = "F"
        elif qW[w] and not (fit and qi and qi[0][0] < t + dur_w[w]) and not (
                fit_f and room and fwd[w] < fcap[w] and qf and qf[0][0] < t + dur_w[w]):
            op = "W"
        else:
            continue  # nothing ready: an arrival will wake this worker
        if op == back:
            _, _, g = pop(qi)
            end = t + dur_back[w]
            out[w].append((back, g, t, end))
            fwd[w] -= 1
            s = stage[w]
            if back == "I":
                qW[w].append(g)
            else:
                held[w] -= 1
            if s > 0:
                w2 = route_w[g][s - 1]
                r = end + (intra if route_d[g][s] == route_d[g][s - 1] else cross)
                push(qI[w2], (r, g, g))
                push(events, (r if r > free_at[w2] else free_at[w2], w2))
        elif op == "F":
            g = pop(rF[w])[1] if by_m else pop(qf)[2]
            end = t + dur_f[w]
            out[w].append(("F", g, t, end))
            held[w] += 1
            fwd[w] += 1
            s = stage[w]
            if s < S - 1:
                w2 = route_w[g][s + 1]
                r = end + (intra if route_d[g][s] == route_d[g][s + 1] else cross)
                push(qF[w2], (r, g % M, g))
                push(events, (r if r > free_at[w2] else free_at[w2], w2))
            else:
                push(qi, (end, g, g))
        else:
            g = qW[w].popleft()
            end = t + dur_w[w]
            out[w].append(("W", g, t, end))
            held[w] -= 1
        free_at[w] = end
        push(events, (end, w))

    timeline: Timeline = {k: out[wid[k]] for k in keys}
    if sum(map(len, out)) != (3 if mode.split_backward else 2) * len(routes) * S:
        raise RuntimeError("list scheduler stalled: some action never became ready")
    return timeline


def peak_held(timeline: Timeline) -> int:
    """The most micro-batches any worker holds at once (from its F's start to the end of
    its B or W): the activation memory a timeline needs, in micro-batches."""
    peak = 0
    for acts in timeline.values():
        held = 0
        for op, _, _, _ in acts:  # in time order; I keeps the micro-batch until its W
            held += 1 if op == "F" else -1 if op in ("B", "W") else 0
            peak = max(peak, held)
    return peak


def best_schedule(job: JobSpec, routes: list[list[int]], mode: Mode,
                  inflight: Optional[list[int]] = None,
                  budget: int = PORTFOLIO_BUDGET) -> Timeline:
    """The best timeline of as many portfolio policies as `budget` scheduled actions allow
    (at least the first). At equal period the one holding fewer micro-batches at its peak
    wins: without a memory limit the base rule runs every F it can (stage 0 of D=1, S=2,
    M=4 held all 4, 1F1B's order 2, for the same period), which costs memory on a GPU and,
    on shared CPU cores, keeps both workers computing at once (llama:debug: 1.09x torch's
    Schedule1F1B with all F's first). Remaining ties keep the earlier policy: the result
    is deterministic."""
    n_actions = (3 if mode.split_backward else 2) * len(routes) * job.stages
    runs = max(1, min(len(PORTFOLIO), budget // max(1, n_actions)))
    best, best_key = None, None
    for policy in PORTFOLIO[:runs]:
        tl = list_schedule(job, routes, mode, inflight, policy)
        key = (timeline_period(job, tl, mode.staggered), peak_held(tl))
        if best_key is None or key < best_key:
            best, best_key = tl, key
    return best


def ranked_schedules(job: JobSpec, failed: list[Worker], mode: Mode,
                     inflight: Optional[list[int]] = None, budget: int = PORTFOLIO_BUDGET
                     ) -> list[tuple[int, list[list[int]], Timeline]]:
    """(period, routes, timeline) for each candidate routing (planner/routing.py), with
    its best portfolio policy, best first; ties keep the candidates' order. The budget goes
    to routings first (with stragglers they matter far more than the policy): each gets an
    equal share of policies, at least one, in the candidates' order while it lasts."""
    n_actions = (3 if mode.split_backward else 2) * job.num_microbatches * job.stages
    runs = max(1, budget // max(1, n_actions))
    cands = route_candidates(job, failed, limit=runs)
    per = max(1, runs // len(cands))
    out = []
    for routes in cands:
        tl = best_schedule(job, routes, mode, inflight, per * n_actions)
        out.append((timeline_period(job, tl, mode.staggered), routes, tl))
    return sorted(out, key=lambda x: x[0])  # stable


def routed_schedule(job: JobSpec, failed: list[Worker], mode: Mode,
                    inflight: Optional[list[int]] = None,
                    budget: int = PORTFOLIO_BUDGET) -> tuple[list[list[int]], Timeline]:
    """The best (routes, timeline) over the candidate routings and the policy portfolio."""
    _, routes, tl = ranked_schedules(job, failed, mode, inflight, budget)[0]
    return routes, tl


def greedy_plan(job: JobSpec, failed: list[Worker], mode: Mode = Mode(),
                routes: Optional[list[list[int]]] = None, name: str = "greedy",
                inflight: Optional[list[int]] = None, portfolio: bool = True) -> Plan:
    """`routes` None: the best candidate routing (one without speeds); `portfolio` False:
    the default routing and the base policy only."""
    t0 = time.perf_counter()
    failed = normalize(job, failed)
    if routes is None and portfolio:
        routes, timeline = routed_schedule(job, failed, mode, inflight)
    else:
        routes = routes if routes is not None else balanced_routes(job, failed)
        timeline = (best_schedule(job, routes, mode, inflight) if portfolio
                    else list_schedule(job, routes, mode, inflight))
    add_opt(job, timeline)
    return finish_plan(job, failed, routes, timeline, mode, name, "HEURISTIC",
                       time.perf_counter() - t0)


def one_f_one_b_plan(job: JobSpec, failed: list[Worker]) -> Plan:
    """The baseline: fused backward, at most S - s micro-batches in flight on a stage-s
    worker (1F1B's warm-up depth), synchronous optimizer; failed workers' micro-batches go
    to their peers by the same balanced routing, with no bubble-filling."""
    S = job.stages
    return greedy_plan(job, failed, Mode(split_backward=False, staggered=False), name="1f1b",
                       inflight=[S - s for s in range(S)], portfolio=False)
