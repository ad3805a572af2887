"""The oracles every policy is measured against (docs/design.md section 12).

`limit`: at every instant the rate no layout of the live workers can beat
(throughput_bound.py: any cut, any depths, any number of replicas; the work and optimizer
steps its workers must run, with no bubble, no p2p latency and fractional workers), and
nothing paid for any event: no detection, no iteration lost, no state to move, no restart,
no checkpoint stall. Stragglers are taken at nominal speed, which only raises it. It is an
upper bound on every policy, not a policy.

`shape-limit` (a what-if beside it): the best rate the planner's own schedules reach on
the family of shapes it knows (planner/shapes/choose.py: one depth for every pipeline, at
most the job's stages, each stage count cut balanced or fitted to the live count), again
with no event costs. Between the two lies what the planner's schedules and its family
leave (bubbles, p2p, whole workers); between it and a policy, what events and the policy's
choices cost. Until the limit was the bound it was this, and pipelines of unequal depth
(Oobleck's) kept more than it on traces it had not been tuned on.
"""
from __future__ import annotations

from functools import cached_property

from planner.simulation.base import Policy
from planner.simulation.engine import Decision
from planner.simulation.throughput_bound import ThroughputBound


class Limit(Policy):
    name = "limit"
    free = True  # no checkpoint stall either (engine.run_policy)

    @cached_property
    def bound(self) -> ThroughputBound:
        ctx = self.ctx
        return ThroughputBound(ctx.model.units, ctx.DM, ctx.model.capacity)

    def period_s(self, n: int):
        P = self.bound.period(n)
        return None if P is None else P * self.ctx.unit_s

    def steady(self, failed, speed):
        ctx = self.ctx
        P = self.period_s(ctx.job.replicas * ctx.job.stages - len(failed))
        return Decision(ctx.DM / P, P) if P else Decision(0.0)

    def start(self, failed, speed):
        return self.steady(failed, speed)  # never halted: it trains whenever it can

    def on_event(self, kind, workers, before, after, speed, run):
        return self.steady(after, speed)


class ShapeLimit(Limit):
    name = "shape-limit"

    def period_s(self, n: int):
        return self.ctx.shapes.limit_period(n)
