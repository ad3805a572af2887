"""The model as an ordered list of units (docs/design.md section 12).

A unit is a piece of the model a stage holds whole: its F/I/W/OPT for one micro-batch, the
activation memory a micro-batch holds through it, the memory its parameters and optimizer
state take on a worker, and the bytes a worker loads to take it over. Where they come
from:
  - a job spec with `layer_cost` (`recycle profile --split balanced`): one unit per layer
    [embedding, blocks..., head]; the job's stages are the balanced split of those costs
    (the split `--split balanced` trains), and each stage's F, I, W, OPT, activation and
    state bytes are shared among its layers in proportion to their profiled cost;
  - any other spec: one unit per stage of the job (nothing finer is known);
  - a simulator preset (planner/simulation/presets.py): its layers, from FLOP counts.
A spec does not say what its parameters take in memory, so a shape cut from a spec's units
may merge at most two of the job's stages into one (`min_stages`, as the simulator's
Oobleck assumes for a spec); a preset's units carry their parameter memory and the memory
test alone decides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from planner.job import JobSpec
from planner.shapes.partition import Bounds, balance


@dataclass(frozen=True)
class Unit:
    """A slice of the model that one stage holds whole: F/I/W/OPT in the spec's time unit,
    its activation memory per micro-batch and its parameter (+ optimizer state) memory in
    the spec's memory unit, and the bytes a worker loads to take it."""
    F: float
    I: float  # noqa: E741
    W: float
    OPT: float
    activation: float = 0
    params: float = 0  # 0: not known (a spec)
    state_bytes: float = 0

    @property
    def work(self) -> float:
        """What partitions balance: one micro-batch's F+I+W through the unit."""
        return self.F + self.I + self.W


@dataclass(frozen=True)
class Units:
    """A job's units, its own partition of them, and a worker's memory."""
    units: tuple[Unit, ...]
    kind: str  # "layer" | "stage" (planner/shapes/partition.py, Partition.unit)
    fixed: Bounds  # the job's own partition (its stages' unit ranges)
    capacity: Optional[float]  # a worker's memory, spec unit (None: no limit)
    min_stages: int  # fewest stages a shape may have

    def fits(self, i: int, j: int) -> bool:
        """A worker holds units [i, j): their parameters and one micro-batch's activations."""
        if self.capacity is None:
            return True
        held = sum(u.params + u.activation for u in self.units[i:j])
        return held <= self.capacity

    def state(self, i: int, j: int) -> float:
        return sum(u.state_bytes for u in self.units[i:j])


def min_stages(units: tuple[Unit, ...], stages: int) -> int:
    """Without parameter memory a worker is assumed to hold at most two of the job's
    stages; with it the memory test decides."""
    return 1 if any(u.params for u in units) else -(-stages // 2)


def units_of_job(job: JobSpec) -> Units:
    """The units of a job spec (module doc)."""
    S = job.stages
    mem = job.memory
    cap = min(mem.capacity) if mem else None
    act = list(mem.activation) if mem else [0] * S
    state = list(job.state_bytes) if job.state_bytes is not None else [0] * S
    lc = job.layer_cost
    if not lc or len(lc) < S:
        units = tuple(Unit(job.cost.F[s], job.cost.I[s], job.cost.W[s], job.cost.OPT[s],
                           act[s], 0, state[s]) for s in range(S))
        return Units(units, "stage", tuple(range(S + 1)), cap, min_stages(units, S))
    fixed = balance([float(c) for c in lc], S)
    units = []
    for s, (i, j) in enumerate(zip(fixed, fixed[1:])):
        total = sum(lc[i:j])
        for u in range(i, j):
            share = lc[u] / total if total else 1 / (j - i)
            units.append(Unit(job.cost.F[s] * share, job.cost.I[s] * share,
                              job.cost.W[s] * share, job.cost.OPT[s] * share,
                              act[s] * share, 0, state[s] * share))
    units = tuple(units)
    return Units(units, "layer", fixed, cap, min_stages(units, S))
