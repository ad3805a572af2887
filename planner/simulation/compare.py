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


def simulate(job: JobSpec, trace: Trace, duration_s: float, unit_s: float,
             params: Params = Params(), policies: Iterable[str] = tuple(POLICIES),
             checkpoint_every_s: float = 1800.0, checkpoint_cost_s: float = 0.0,
             model: Optional[Model] = None, cache=None,
             tick: Optional[Callable[[], None]] = None) -> Result:
    """Run each named policy over `trace` for `duration_s` seconds."""
    model = model or Model.of_spec(job)
    periods = RecyclePeriods(job, unit_s, cache)
    ctx = Context(job, model, unit_s, periods, Pipelines(job, model, unit_s, greedy_period),
                  params)
    outcomes = []
    for name in policies:
        policy = POLICIES[name](ctx)
        outcomes.append(run_policy(policy, trace.events, trace.initial_failed, duration_s,
                                   checkpoint_every_s, checkpoint_cost_s, tick))
    return Result(job, model, trace, duration_s, ctx.base, outcomes, periods.planned)
