"""Timelines: the solver-neutral result every back-end produces, and its turn into a Plan.

A timeline maps each live worker to its timed actions. `finish_plan` is the one place that
adds the OPT actions' metrics, the lower bound and the solver record, so every back-end's
plan is measured the same way (by the validator's replay).
"""
from __future__ import annotations

from typing import Optional

from planner.failures import Worker
from planner.job import JobSpec
from planner.plan import Metrics, Mode, Plan, SolverInfo, Timeline, WorkerPlan, make_action


def finish_plan(job: JobSpec, failed: list[Worker], routes: list[list[int]], timeline: Timeline,
                mode: Mode, name: str, status: str, wall_s: float,
                bound: Optional[int] = None) -> Plan:
    from planner.bounds import lower_bound
    from planner.validate import replay_metrics

    workers = []
    for (d, s) in sorted(timeline):
        acts = sorted(timeline[(d, s)], key=lambda a: (a[2], a[0] == "OPT"))
        # No validation: the values come from our own solvers, and validating ~200K
        # actions would cost more than scheduling them (the validator checks plans instead).
        workers.append(WorkerPlan.model_construct(replica=d, stage=s, actions=[
            make_action(op, g, st, en) for op, g, st, en in acts]))
    lb = lower_bound(job, failed, mode)
    stag, sync = replay_metrics(job, workers)
    period = stag if mode.staggered else sync
    metrics = Metrics(period=period, makespan=sync, lower_bound=lb,
                      gap=round(period / lb - 1, 6) if lb else 0.0,
                      period_staggered=stag, period_synchronous=sync)
    return Plan(job=job, failed=[tuple(x) for x in failed], routes=routes, workers=workers,
                metrics=metrics,
                solver=SolverInfo(name=name, status=status, wall_s=round(wall_s, 4),
                                  optimizer=mode.optimizer, split_backward=mode.split_backward,
                                  bound=bound))


def add_opt(job: JobSpec, timeline: Timeline) -> None:
    """Append each worker's OPT: the stage's all-reduce starts once every live peer of the
    stage has finished its last weight gradient, on all peers at once."""
    ready: dict[int, int] = {}
    for (d, s), acts in timeline.items():
        last = max((a[3] for a in acts), default=0)
        ready[s] = max(ready.get(s, 0), last)
    for (d, s), acts in timeline.items():
        t = ready[s]
        acts.append(("OPT", None, t, t + job.duration("OPT", d, s)))
