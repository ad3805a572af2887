"""ReCycle whose shape follows the live workers (docs/design.md section 12): the
simulator's `recycle` policy, what `recycle train --shape speed` runs, and `recycle-short`,
what the default `--shape auto` runs (the same chooser, asked only once too few live).

`recycle-roles` (elastic.py) with one more choice after every event: the partition of the
model's units into stages (planner/shapes/). The live workers train on the shape worth most
over the horizon (planner/shapes/choose.py): the current one with the best roles, or
another whose better period repays the state its workers must fetch. So with fewer live
workers than stages it trains on a shallower shape instead of pausing; it pauses only
when no shape fits the live workers (none alive, or a spec's units allow no shape that
shallow). What an event costs is elastic.py's: detection and the iteration in flight for
a failure, the stall of the state loads (a shape change's included), a snapshot restore
when a stage of the current shape lost every holder (its units come from the snapshot),
a checkpoint restore when the snapshot went too. Periods are the planner's for each
shape (shape_costs.py).
"""
from __future__ import annotations

from planner.simulation.policies.elastic import ElasticRecycle, _wid
from planner.simulation.engine import Decision


class ShapedRecycle(ElasticRecycle):
    name = "recycle"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.costs = ctx.shapes
        self.shape = self.costs.chooser.fixed
        self.shape_changes = 0
        self.now = 0.0
        self.timeline: list[tuple[float, int]] = []  # (time, stages) at each change

    def _stages(self) -> int:
        return self.shape.stages

    def _stage_job(self):
        return self.shape.job

    def _cut(self):
        return tuple(self.shape.bounds)

    def _choose(self, speed):
        ctx, sc, cur = self.ctx, self.costs, self.shape
        here = self._slot_speed(speed)
        c = sc.chooser.choose(cur, self.live, ctx.horizon_s / ctx.unit_s,
                              current_period=lambda failed: sc.period(cur, failed, here))
        if c.changed or not self.timeline:
            self.shape_changes += c.changed
            self.timeline.append((self.now, c.shape.stages))
        self.shape = c.shape
        P = sc.period(c.shape, c.failed, self._slot_speed_of(speed, c.slots)) * ctx.unit_s
        return c.slots, c.moves, P, c.stall

    def start(self, failed, speed):
        """On the user's grid, every live worker in its home slot, as the product starts
        (the launcher's and the service's first plan): the shape is chosen at events only,
        so a run with no failure trains the grid the user asked for. Only a grid with some
        stage left empty at the start is placed by the chooser."""
        D, S = self.ctx.job.replicas, self.ctx.job.stages
        if len({s for d in range(D) for s in range(S) if (d, s) not in failed}) < S:
            return super().start(failed, speed)
        self.live = {_wid((d, s)): (d, s) for d in range(D) for s in range(S)
                     if (d, s) not in failed}
        self.timeline.append((0.0, S))
        self._pick_holders()
        P = self.ctx.periods(frozenset(failed), self._slot_speed(speed))
        if self.ctx.params.replay:  # the boundary logs' share, as _assign charges it
            P = P / (1.0 - self.ctx.params.swift_log_overhead)
        return Decision(self.ctx.DM / P, P)

    def on_event(self, kind, workers, before, after, speed, run):
        self.now = run.t
        return super().on_event(kind, workers, before, after, speed, run)

    def stages_hours(self, duration_s: float) -> dict[int, float]:
        """Hours on each stage count (while training or paused on it)."""
        out: dict[int, float] = {}
        marks = self.timeline + [(duration_s, 0)]
        for (t0, k), (t1, _) in zip(marks, marks[1:]):
            out[k] = out.get(k, 0.0) + max(0.0, min(t1, duration_s) - t0) / 3600
        return out


class ShapedWhenShort(ShapedRecycle):
    """`recycle` under the default `--shape auto` (planner/control/membership.py without
    `speed_cuts`): the shape is chosen only where fewer live workers than the job's stages
    are left, and at every event once it changed; until then the roles on the job's own partition
    (`recycle-roles`). What `recycle` gains over it is the speed a shallower shape gives
    while as many workers as stages live."""
    name = "recycle-short"

    def _choose(self, speed):
        if not self.shape_changes and len(self.live) >= self.ctx.job.stages:
            if not self.timeline:
                self.timeline.append((self.now, self.shape.stages))
            return ElasticRecycle._choose(self, speed)
        return super()._choose(speed)

