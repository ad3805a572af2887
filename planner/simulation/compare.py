"""Every policy on the same trace: the simulator's entry point for code."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from planner.job import JobSpec
from planner.simulation.costs import Model, Pipelines, RecyclePeriods, greedy_period
from planner.simulation.engine import Outcome, run_policy
from planner.simulation.policies import POLICIES, Context, Params
from planner.simulation.trace import Trace


@dataclass
class Result:
    job: JobSpec
    model: Model
    trace: Trace
    duration_s: float
    base_rate: float  # micro-batches per second without failures
    outcomes: list[Outcome]
    plans_made: int = 0

    @property
    def ideal(self) -> float:
        return self.base_rate * self.duration_s

    def outcome(self, name: str) -> Outcome:
        return next(o for o in self.outcomes if o.policy == name)


def failed_sets(job: JobSpec, trace: Trace, duration_s: float) -> list[frozenset]:
    """Every plannable failed set the trace passes through (none when it carries speeds:
    those sets are planned as they come)."""
    from planner.failures import dead_stage

    if any(e.kind == "speed" for e in trace.events):
        return []
    failed, out = set(trace.initial_failed), [frozenset(trace.initial_failed)]
    for e in trace.events:
        if e.time >= duration_s:
            break
        (failed.update if e.kind == "fail" else failed.difference_update)(e.workers)
        out.append(frozenset(failed))
    return [f for f in out if dead_stage(job, f) is None]


def simulate(job: JobSpec, trace: Trace, duration_s: float, unit_s: float,
             params: Params = Params(), policies: Iterable[str] = tuple(POLICIES),
             checkpoint_every_s: float = 1800.0, checkpoint_cost_s: float = 0.0,
             model: Optional[Model] = None, cache=None,
             tick: Optional[Callable[[], None]] = None, jobs: int = 1) -> Result:
    """Run each named policy over `trace` for `duration_s` seconds; `jobs` processes plan
    the trace's failed sets ahead."""
    model = model or Model.of_spec(job)
    policies = list(policies)
    periods = RecyclePeriods(job, unit_s, cache)
    if jobs > 1 and {"recycle", "swift-replay"} & set(policies):
        periods.prefetch(failed_sets(job, trace, duration_s), jobs)
    ctx = Context(job, model, unit_s, periods, Pipelines(job, model, unit_s, greedy_period),
                  params)
    outcomes = []
    for name in policies:
        policy = POLICIES[name](ctx)
        outcomes.append(run_policy(policy, trace.events, trace.initial_failed, duration_s,
                                   checkpoint_every_s, checkpoint_cost_s, tick))
    return Result(job, model, trace, duration_s, ctx.base, outcomes, periods.planned)
