"""A plan on the shape chosen for a failed set (`recycle plan --fail ... --shape auto`).

The live workers are the job's grid less the failed set, each in its home slot of the
job's own partition (and `join`: fresh workers with no state); the shape and slots are
choose.py's, the schedule the back-end's for the chosen shape's job and empty slots. The
plan carries the partition when the shape is not the job's own, with the roles and the
moves (each worker's state to load) that take the workers there.
"""
from __future__ import annotations

from typing import Mapping, Optional, Union

from planner.control.roles import live_from_failed
from planner.failures import normalize
from planner.job import JobSpec
from planner.plan import Mode, Plan
from planner.control.count_bounds import NoRolesError
from planner.shapes.choose import ShapeChoice, ShapeChooser
from planner.shapes.partition import Partition
from planner.shapes.shape import Shape
from planner.shapes.units import units_of_job

# up to this many workers the shapes are compared on the greedy back-end's periods (tens
# of milliseconds each); above it on the count bound, as the service would
PLANNED_UP_TO = 256


def chooser_for(job: JobSpec) -> ShapeChooser:
    period = None
    if job.replicas * job.stages <= PLANNED_UP_TO:
        from planner.simulation.costs import plan_period

        period = lambda shape, failed: plan_period(shape.job, failed)  # noqa: E731
    return ShapeChooser(job, units_of_job(job), period)


_CHOOSERS: dict[tuple, ShapeChooser] = {}


def _chooser(job: JobSpec, snapshots: bool) -> ShapeChooser:
    """One chooser per job (its family and memos) for the run's decisions."""
    key = (job.spec_hash(), snapshots)
    if key not in _CHOOSERS:
        ch = chooser_for(job)
        ch.snapshots = snapshots
        _CHOOSERS.clear()  # one run's job at a time
        _CHOOSERS[key] = ch
    return _CHOOSERS[key]


def shaped_plan_parts(job: JobSpec, current: Optional[tuple[Partition, JobSpec]],
                      live: Mapping[str, Optional[tuple[int, int]]], horizon: float,
                      snapshots: bool = False) -> Union[str, tuple[ShapeChoice, Partition]]:
    """A run's next shape (planner/control/membership.py): the choice for `live` workers
    (id -> slot of the shape in force, `current`: its partition and job, None for the
    job's own; None for a worker with no state) and the partition its plan carries, the
    job's own spelled out too (a run that changed shape keeps one on every plan). The
    reason, when no shape fits the live workers."""
    ch = _chooser(job, snapshots)
    if current is None or tuple(current[0].bounds) == tuple(ch.fixed.bounds):
        cur = ch.fixed
    else:
        cur = Shape(tuple(current[0].bounds), current[1], False)
    try:
        c = ch.choose(cur, live, horizon)
    except NoRolesError as exc:
        return str(exc)
    part = c.shape.partition(job, ch.units) or Partition(
        unit=ch.units.kind, bounds=list(ch.fixed.bounds), base=job.identity_hash())
    return c, part


def choose_for_failed(job: JobSpec, failed, horizon: float, join: tuple[str, ...] = ()
                      ) -> tuple[ShapeChooser, ShapeChoice]:
    ch = chooser_for(job)
    live = live_from_failed(job, normalize(job, failed), join)
    return ch, ch.choose(ch.fixed, live, horizon)


def plan_shape(job: JobSpec, failed, horizon: float, solver: str = "greedy",
               mode: Mode = Mode(), opts=None, join: tuple[str, ...] = ()
               ) -> tuple[Plan, ShapeChoice]:
    from planner.solvers.backends import SolveOptions, solve

    ch, c = choose_for_failed(job, failed, horizon, join)
    plan = solve(c.shape.job, c.failed, solver, mode, opts or SolveOptions())
    plan = plan.with_roles(c.roles, c.moves)
    part = c.shape.partition(job, ch.units)
    if part is not None:
        plan = plan.model_copy(update={"partition": part})
    return plan, c


def shape_line(choice: ShapeChoice, units_kind: str, fixed_stages: int) -> Optional[str]:
    """One line on the chosen shape when it is not the job's own (None when it is)."""
    if not choice.changed:
        return None
    what = "layers" if units_kind == "layer" else "job stages"
    cut = " | ".join(f"{i}-{j - 1}" if j - 1 > i else f"{i}" for i, j in choice.shape.ranges())
    return (f"shape: {choice.shape.stages} stages instead of {fixed_stages} ({what} {cut}): "
            f"{choice.reason}")
