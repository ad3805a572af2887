"""Speeds at the service (docs/design.md section 8, docs/api.md "Stragglers"): which speed grid a
job's plans are made for, from three sources.

A worker's speed in force is, in this order of precedence:
  1. the operator's setting (a speed event, `POST /v1/jobs/{id}/speeds`), until cleared;
  2. the straggler detector's level (planner.speeds.SpeedDetector, fed by the compute
     times workers put in their heartbeats), when it says the worker is slow (< 1.0);
  3. the registered job spec's own `speed` (1.0 when it has none).
The grid in force is the `speed` of the plan version in force (`plan.job.speed`), so a
restart reads it back from the latest stored plan; the operator's settings are replayed
from the speed events, and what remains different from 1 and 3 is the detector's.

planner.speeds.with_speeds quantises to at most 1.0 and also quantises the spec's own
speeds; here an operator may say a worker is faster than nominal (up to 100), and the
spec's own speeds are left as registered, so the spec is built here (same step, 0.1).
"""
from __future__ import annotations

import json
from typing import Optional

from pydantic import ValidationError

from planner.job import JobSpec
from planner.speeds import MAX_SPEED, quantize
from planner.errors import UserError

Worker = tuple[int, int]
Cells = dict[Worker, float]


def quantize_speed(v: float) -> float:
    """Speeds an operator or a spec declares: up to MAX_SPEED, on the 0.1 steps."""
    return quantize(v, top=MAX_SPEED)


def grid_of(spec: JobSpec) -> list[list[float]]:
    """The speed grid a spec carries, 1.0 everywhere when it has none."""
    if spec.speed is None:
        return [[1.0] * spec.stages for _ in range(spec.replicas)]
    return [list(row) for row in spec.speed]


def speed_of(spec: JobSpec, w: Worker) -> float:
    return 1.0 if spec.speed is None else spec.speed[w[0]][w[1]]


def slow_count(spec: JobSpec) -> int:
    return 0 if spec.speed is None else sum(v < 1.0 for row in spec.speed for v in row)


class SpeedError(UserError):
    """Speeds this job's spec cannot take (its horizon would exceed the bound)."""


def spec_for(base: JobSpec, operator: Cells, measured: Cells) -> JobSpec:
    """The registered spec `base` with the speeds in force: the operator's settings over
    the detector's levels over the spec's own. Validated (JobSpec's bounds: a speed so
    small that a plan's times would overflow is refused with SpeedError)."""
    cells = {**measured, **operator}
    if not cells:
        return base
    grid = grid_of(base)
    for (d, s), v in cells.items():
        grid[d][s] = v
    speed = None if all(v == 1.0 for row in grid for v in row) else grid
    if speed == base.speed:
        return base
    try:
        return JobSpec.model_validate({**base.model_dump(), "speed": speed})
    except ValidationError as e:
        msg = e.errors()[0].get("msg", "invalid") if e.errors() else str(e)
        raise SpeedError(msg.replace("Value error, ", "").replace("\n", " ")[:300]) from None


def restore(base: JobSpec, in_force: JobSpec, speed_events) -> tuple[Cells, Cells]:
    """(operator settings, detector levels) of a job after a restart: the settings are
    replayed from its speed events (rows with `source` and `body_json`, oldest first); a
    cell of the grid in force that differs from both is the detector's."""
    operator: Cells = {}
    for row in speed_events:
        if row["source"] == "detector":
            continue
        body = json.loads(row["body_json"])
        w = (body["replica"], body["stage"])
        if body.get("speed") is None:
            operator.pop(w, None)
        else:
            operator[w] = quantize_speed(body["speed"])
    measured: Cells = {}
    if in_force.speed is not None:
        for d, row in enumerate(in_force.speed):
            for s, v in enumerate(row):
                if (d, s) not in operator and v != speed_of(base, (d, s)) and v < 1.0:
                    measured[(d, s)] = v
    return operator, measured


def measured_reason(est: Optional[float], window: int) -> str:
    if est is None:
        return "straggler detector"
    return (f"straggler detector: {est:.2f} of the stage's fastest worker (best of the "
            f"last {window} iterations)")
