"""The oracle every policy is measured against (docs/design.md section 12): `limit`.

At every instant it trains at the best rate any shape of the job's family
(planner/shapes/) and any filled slots of the live workers reach with the planner's
schedules, and pays nothing for any event: no detection, no iteration lost, no state to
move, no restart, no checkpoint stall. It ignores stragglers' speeds (every live worker
at nominal speed), which only raises it. With every worker live it trains at the best
shape's rate, which may beat the user's grid (shape_costs.py). "Any shape" is the family
the planner knows (planner/shapes/choose.py, candidates): one depth for all pipelines, at
most the job's stages, each stage count cut balanced or fitted to the live count.
"""
from __future__ import annotations

from planner.simulation.base import Policy
from planner.simulation.engine import Decision


class Limit(Policy):
    name = "limit"
    free = True  # no checkpoint stall either (engine.run_policy)

    def steady(self, failed, speed):
        ctx = self.ctx
        n = ctx.job.replicas * ctx.job.stages - len(failed)
        P = ctx.shapes.limit_period(n)
        return Decision(ctx.DM / P, P) if P else Decision(0.0)

    def start(self, failed, speed):
        return self.steady(failed, speed)  # never halted: it trains whenever it can

    def on_event(self, kind, workers, before, after, speed, run):
        return self.steady(after, speed)
