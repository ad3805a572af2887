"""Periods of the job's shapes (planner/shapes/), for the `recycle` and `limit` policies.

Every shape's period for a filled-slot set is the greedy back-end's, as for the job's own
partition (costs.RecyclePeriods, one per cut, memoised on the canonical set). Rates are in
the currency every policy shares: D*M micro-batches over the period, in seconds. A shape
other than the user's may train all D*S workers faster than the user's grid does (on the
real-trace grids the best shape is 2-11% faster: fewer stages, fewer bubbles, balanced
cuts); `full_factor` says by how much, and the report shows it.
"""
from __future__ import annotations

from functools import cached_property
from typing import Optional

from planner.job import JobSpec
from planner.shapes.choose import ShapeChooser
from planner.shapes.shape import Shape
from planner.shapes.units import Units, min_stages
from planner.simulation.costs import Model, RecyclePeriods, group_bounds


def model_units(job: JobSpec, model: Model) -> Units:
    """The simulator's model as the planner's units: a preset's layers (its stages are
    `group`'s cut of them), or a spec's stages."""
    spec = model.name == "spec"
    fixed = tuple(range(job.stages + 1)) if spec else group_bounds(model.units, job.stages)
    return Units(model.units, "stage" if spec else "layer", fixed, model.capacity,
                 min_stages(model.units, job.stages))


class ShapeCosts:
    def __init__(self, job: JobSpec, model: Model, unit_s: float, fixed: RecyclePeriods,
                 snapshots: bool):
        self.job, self.unit_s = job, unit_s
        self.units = model_units(job, model)
        self._periods: dict[tuple, RecyclePeriods] = {}
        self._fixed = fixed
        self.chooser = ShapeChooser(job, self.units, self.period, snapshots=snapshots)
        self._limit: dict[int, Optional[float]] = {}

    # The best shape of every worker is found on first use, not here: it plans every
    # candidate shape of D*S workers, 2 minutes at 2,048 workers, which a policy that keeps
    # the job's own shape (recycle-short while enough workers live) never needs.
    @cached_property
    def _best_full(self):
        return self.chooser.best(self.job.replicas * self.job.stages)

    @property
    def best_full(self) -> Shape:
        """The best shape with every worker live."""
        return self._best_full[0]

    @property
    def full_factor(self) -> float:
        """How much faster than the user's grid the best shape trains every worker."""
        n = self.job.replicas * self.job.stages
        return self.chooser.fresh(self.chooser.fixed, n)[2] / self._best_full[1]

    def periods(self, shape: Shape) -> RecyclePeriods:
        if shape.fixed:
            return self._fixed
        if shape.bounds not in self._periods:
            self._periods[shape.bounds] = RecyclePeriods(shape.job, self.unit_s)
        return self._periods[shape.bounds]

    def period(self, shape: Shape, failed, speed: Optional[dict] = None) -> int:
        """Time units: the planner's period for `failed` (empty slots) on `shape`."""
        return round(self.periods(shape)(frozenset(failed), speed) / self.unit_s)

    def limit_period(self, n: int) -> Optional[float]:
        """Seconds per iteration of the best shape and filled slots of n live workers."""
        if n not in self._limit:
            got = self.chooser.best(n) if n > 0 else None
            self._limit[n] = None if got is None else got[1] * self.unit_s
        return self._limit[n]
