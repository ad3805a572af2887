"""The validator: checks every constraint of docs/design.md section 4 and replays the metrics.

Every back-end's plan goes through `validate` in the tests; `check` raises with the first
few violations. Constraint numbers in the messages follow docs/design.md section 4.
"""
from __future__ import annotations

from planner.failures import FailedSetError, NoPlanError, normalize, dead_stage
from planner.plan import Plan, WorkerPlan
from planner.routing import check_routes
from planner.job import JobSpec
from planner.errors import UserError


class InvalidPlan(UserError):
    pass


def replay_metrics(job: JobSpec, workers: list[WorkerPlan]) -> tuple[int, int]:
    """(period with a staggered optimizer, makespan) recomputed from the actions."""
    first = min((w.actions[0].start for w in workers if w.actions), default=0)
    makespan = max((a.end for w in workers for a in w.actions), default=0) - first
    span = max((w.actions[-1].end - w.actions[0].start for w in workers if w.actions), default=0)
    return span, makespan


def validate(plan: Plan) -> list[str]:
    """All violations found (empty list: the plan is valid)."""
    job = plan.job
    errs: list[str] = []
    try:
        failed = normalize(job, plan.failed)
    except FailedSetError as e:
        return [str(e)]
    if failed != [tuple(f) for f in plan.failed]:
        errs.append("failed must list distinct [replica, stage] pairs, sorted")
    if dead_stage(job, failed) is not None:
        return [str(NoPlanError(dead_stage(job, failed)))]
    errs += role_errors(plan, failed)
    if plan.partition is not None and plan.partition.stages != job.stages:
        errs.append(f"the partition has {plan.partition.stages} stages, the plan's job "
                    f"{job.stages}")
    errs += check_routes(job, failed, plan.routes)
    if errs:
        return errs
    dead = set(failed)
    split = plan.solver.split_backward
    ops = ("F", "I", "W") if split else ("F", "B")
    back = "I" if split else "B"
    D, S = job.replicas, job.stages
    seen_workers = set()
    where: dict[tuple[str, int, int], tuple[int, int, int]] = {}  # (op,s,g) -> (replica,start,end)
    for w in plan.workers:
        k = (w.replica, w.stage)
        if not (0 <= w.replica < D and 0 <= w.stage < S):
            errs.append(f"worker {k} is outside the grid")
            continue
        if k in dead:
            errs.append(f"(1) failed worker {k} has actions")
        if k in seen_workers:
            errs.append(f"worker {k} listed twice")
        seen_workers.add(k)
        _check_worker(job, w, ops, errs, where)
    for d in range(D):
        for s in range(S):
            if (d, s) not in dead and (d, s) not in seen_workers:
                errs.append(f"live worker {(d, s)} has no entry")
    for g in range(job.num_microbatches):
        for s in range(S):
            for op in ops:
                if (op, s, g) not in where:
                    errs.append(f"(1) {s}{op}{g} is missing")
                elif where[(op, s, g)][0] != plan.routes[g][s]:
                    errs.append(f"(1) {s}{op}{g} runs on replica {where[(op, s, g)][0]}, "
                                f"but routes[{g}][{s}] = {plan.routes[g][s]}")
    if errs:
        return errs[:50]
    for g in range(job.num_microbatches):
        r = plan.routes[g]
        for s in range(S):
            f = where[("F", s, g)]
            if s > 0:
                prev = where[("F", s - 1, g)]
                if f[1] < prev[2] + job.delay(r[s - 1], r[s]):
                    errs.append(f"(2) {s}F{g} starts at {f[1]} before {s-1}F{g} ends + delay")
            b = where[(back, s, g)]
            if s == S - 1:
                if b[1] < f[2]:
                    errs.append(f"(3) {s}{back}{g} starts before {s}F{g} ends")
            else:
                nxt = where[(back, s + 1, g)]
                if b[1] < nxt[2] + job.delay(r[s + 1], r[s]):
                    errs.append(f"(3) {s}{back}{g} starts at {b[1]} before {s+1}{back}{g} ends + delay")
            if split and where[("W", s, g)][1] < b[2]:
                errs.append(f"(4) {s}W{g} starts before {s}I{g} ends")
    _check_opt(job, plan, ops[-1], errs)
    return errs[:50]


def role_errors(plan: Plan, failed: list) -> list[str]:
    """Roles and moves (docs/design.md, "Roles"): each live slot filled by exactly one
    worker, each worker in one slot, the failed set the slots no role fills, and each move
    naming a worker's new stage with that stage's bytes (the spec's state_bytes)."""
    if plan.roles is None:
        return ["moves without roles"] if plan.moves else []
    job, errs = plan.job, []
    slots, workers = {}, {}
    for r in plan.roles:
        k = (r.replica, r.stage)
        if not (r.replica < job.replicas and r.stage < job.stages):
            errs.append(f"role of {r.worker}: slot {k} is outside the grid")
        if k in slots:
            errs.append(f"roles: {slots[k]} and {r.worker} both fill slot {k}")
        if r.worker in workers:
            errs.append(f"roles: worker {r.worker} fills two slots, {workers[r.worker]} and {k}")
        slots[k], workers[r.worker] = r.worker, k
    empty = sorted((d, s) for d in range(job.replicas) for s in range(job.stages)
                   if (d, s) not in slots)
    if empty != [tuple(f) for f in failed]:
        errs.append(f"roles leave slots {empty[:8]} empty but the plan's failed set is "
                    f"{[tuple(f) for f in failed][:8]}")
    moved = set()
    for m in plan.moves or []:
        if m.worker not in workers:
            errs.append(f"move of {m.worker}: it has no role")
        elif workers[m.worker][1] != m.to_stage:
            errs.append(f"move of {m.worker} to stage {m.to_stage}, but its role is stage "
                        f"{workers[m.worker][1]}")
        if m.worker in moved:
            errs.append(f"worker {m.worker} moves twice")
        moved.add(m.worker)
        want = job.state_bytes[m.to_stage] if job.state_bytes is not None and \
            m.to_stage < job.stages else 0
        if plan.partition is not None:
            # a shape change: from_stage is the worker's stage in the previous shape, and it
            # loads what it lacks of its new stage (planner/shapes/transition.py)
            if m.to_stage < job.stages and not 0 <= m.bytes <= want:
                errs.append(f"move of {m.worker} to stage {m.to_stage} carries {m.bytes} "
                            f"bytes, more than the stage's state of {want}")
            continue
        if m.from_stage == m.to_stage:
            errs.append(f"move of {m.worker} keeps stage {m.to_stage}")
        if m.to_stage < job.stages and m.bytes != want:
            errs.append(f"move of {m.worker} to stage {m.to_stage} carries {m.bytes} bytes, "
                        f"the stage's state is {want}")
    return errs


def _check_worker(job, w: WorkerPlan, ops, errs, where) -> None:
    d, s = w.replica, w.stage
    prev_end = None
    n_opt = 0
    for idx, a in enumerate(w.actions):
        if a.start < 0 or a.end < a.start:
            errs.append(f"worker {(d, s)}: action {a.label(s)} has bad times {a.start}..{a.end}")
        if a.op == "OPT":
            n_opt += 1
            if idx != len(w.actions) - 1:
                errs.append(f"(7) worker {(d, s)}: OPT is not its last action")
        elif a.op not in ops:
            errs.append(f"worker {(d, s)}: op {a.op} does not belong in this plan (ops {ops})")
            continue
        elif a.microbatch is None or not 0 <= a.microbatch < job.num_microbatches:
            errs.append(f"worker {(d, s)}: {a.op} has no valid micro-batch")
            continue
        else:
            key = (a.op, s, a.microbatch)
            if key in where:
                errs.append(f"(1) {s}{a.op}{a.microbatch} appears more than once")
            where[key] = (d, a.start, a.end)
        if a.end - a.start != job.duration(a.op, d, s):
            errs.append(f"worker {(d, s)}: {a.label(s)} lasts {a.end - a.start}, "
                        f"expected {job.duration(a.op, d, s)}")
        if prev_end is not None and a.start < prev_end:
            errs.append(f"(5) worker {(d, s)}: {a.label(s)} starts at {a.start} before the "
                        f"previous action ends at {prev_end}")
        prev_end = a.end
    if n_opt != 1:
        errs.append(f"(7) worker {(d, s)} has {n_opt} OPT actions, expected 1")
    _check_memory(job, w, ops[-1], errs)


def _check_memory(job, w: WorkerPlan, release_op: str, errs) -> None:
    if job.memory is None:
        return
    s = w.stage
    act, cap = job.memory.activation[s], job.memory.capacity[s]
    events = []
    for a in w.actions:
        if a.op == "F":
            events.append((a.start, 1, act))
        elif a.op == release_op:
            events.append((a.end, 0, -act))  # a release at t happens before a take at t
    level = 0
    for t, _, delta in sorted(events):
        level += delta
        if level > cap:
            errs.append(f"(6) worker {(w.replica, s)} holds {level} > capacity {cap} at {t}")
            return


def _check_opt(job, plan: Plan, release_op: str, errs) -> None:
    last_w: dict[int, int] = {}
    for w in plan.workers:
        for a in w.actions:
            if a.op == release_op:
                last_w[w.stage] = max(last_w.get(w.stage, 0), a.end)
    for w in plan.workers:
        opt = w.actions[-1] if w.actions else None
        if opt is not None and opt.op == "OPT" and opt.start < last_w.get(w.stage, 0):
            errs.append(f"(7) worker {(w.replica, w.stage)}: OPT starts at {opt.start} before "
                        f"the stage's last {release_op} ends at {last_w[w.stage]}")


def metric_errors(plan: Plan) -> list[str]:
    """What the plan's reported metrics get wrong against a replay of its actions."""
    m = plan.metrics
    stag, sync = replay_metrics(plan.job, plan.workers)
    want = stag if plan.solver.optimizer == "staggered" else sync
    errs = []
    if m.period != want or m.makespan != sync:
        errs.append(f"metrics say period {m.period}, makespan {m.makespan}; replay gives "
                    f"{want}, {sync}")
    for name, got in (("period_staggered", m.period_staggered),
                      ("period_synchronous", m.period_synchronous)):
        real = stag if name == "period_staggered" else sync
        if got is not None and got != real:
            errs.append(f"metrics say {name} {got}; replay gives {real}")
    if m.lower_bound > want:
        errs.append(f"metrics say lower bound {m.lower_bound}, above the period {want}")
    gap = round(m.period / m.lower_bound - 1, 6) if m.lower_bound else 0.0
    if abs(m.gap - gap) > 1e-6:
        errs.append(f"metrics say gap {m.gap}; period {m.period} over lower bound "
                    f"{m.lower_bound} gives {gap}")
    return errs


def check(plan: Plan) -> Plan:
    """Raise InvalidPlan unless the plan is valid and its metrics match a replay."""
    errs = validate(plan)
    if not errs:
        errs = metric_errors(plan)
    if errs:
        raise InvalidPlan("; ".join(errs[:5]))
    return plan
