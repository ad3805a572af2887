"""What can be planned in time: limits every entry point checks before it plans.

JobSpec's own bounds (planner/job.py) keep numbers representable; these keep the work
bounded. The greedy back-end is what every entry point runs first (the service on each
registration and event, `recycle plan`, `recycle train`); its time grows with the actions
(D*S*M) and the workers (D*S). Measured on this project's shared 2-core machine
(docs/planner.md, "Limits"), the largest jobs within both limits plan in about 2 s; past
them one plan took 5 s and more (512 x 256 x 1: 5.1 s, 1 x 131072 x 1: 5.6 s), and the
time keeps growing with the grid.

Files are read only up to a size, so that a huge document is refused before it is parsed
(a 50 MB spec took 1.4 GB and 9 s to be refused by `validate`).
"""
from __future__ import annotations

import os

from planner.errors import UserError

MAX_PLAN_CELLS = 131072   # replicas * stages * microbatches
MAX_PLAN_WORKERS = 16384  # replicas * stages
MAX_SPEC_BYTES = 4 << 20  # a spec at the limits with speeds is about 1 MB
MAX_PLAN_BYTES = 64 << 20  # a plan at the limits is about 25 MB


class TooLarge(UserError):
    """A job, or a file, over the planning limits; the message is one line."""


def check_plannable(replicas: int, stages: int, microbatches: int) -> None:
    """Refuse a grid that cannot be planned in time (TooLarge, one line)."""
    cells = replicas * stages * microbatches
    for what, got, limit in (("replicas*stages", replicas * stages, MAX_PLAN_WORKERS),
                             ("replicas*stages*microbatches", cells, MAX_PLAN_CELLS)):
        if got > limit:
            raise TooLarge(f"job too large to plan in time: {what} = {got} exceeds {limit} "
                           f"(see docs/planner.md, Limits)")


def read_text(path: str, limit: int = MAX_SPEC_BYTES, what: str = "file") -> str:
    """A file's text, refused (TooLarge) before reading if it is over `limit` bytes."""
    size = os.stat(path).st_size
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    if size > limit:
        raise TooLarge(f"{what} {path} is {size / 2**20:.1f} MiB, over the limit of "
                       f"{limit / 2**20:g} MiB")
    with open(path) as fh:
        return fh.read()


def load_spec(path: str, plannable: bool = True):
    """A job spec from a file, refused with one line if it is too large to read or plan."""
    from planner.job import JobSpec
    spec = JobSpec.model_validate_json(read_text(path, MAX_SPEC_BYTES, "job spec"))
    if plannable:
        check_plannable(spec.replicas, spec.stages, spec.microbatches)
    return spec


def plan_bytes_limit(replicas: int, stages: int, microbatches: int) -> int:
    """Generous size of a plan file for this grid (indented JSON): its actions and routes
    at 256 bytes each, plus 64 KiB; a plan far larger carries something else."""
    actions = replicas * stages * (3 * microbatches + 2)
    return (64 << 10) + 256 * (actions + replicas * microbatches * stages)


def load_plan(path: str):
    """A plan from a file, refused with one line if it is too large to read or replay.
    The grid is read first (a skim that builds no lists), so a huge document is refused
    before it is turned into Python objects (a 50 MB spec took 1.4 GB and 9 s)."""
    from pydantic import BaseModel, ConfigDict

    from planner.plan import Plan

    class _Grid(BaseModel):
        model_config = ConfigDict(extra="ignore")
        replicas: int
        stages: int
        microbatches: int

    class _Head(BaseModel):
        model_config = ConfigDict(extra="ignore")
        job: _Grid

    text = read_text(path, MAX_PLAN_BYTES, "plan")
    try:
        grid = _Head.model_validate_json(text).job
    except ValueError:
        if len(text) > MAX_SPEC_BYTES:
            raise TooLarge(f"plan {path}: no job grid (job.replicas, job.stages, "
                           f"job.microbatches) in {len(text) / 2**20:.1f} MiB") from None
        return Plan.model_validate_json(text)  # its own, precise, complaint
    check_plannable(grid.replicas, grid.stages, grid.microbatches)
    limit = plan_bytes_limit(grid.replicas, grid.stages, grid.microbatches)
    if len(text) > limit:
        raise TooLarge(f"plan {path} is {len(text) / 2**20:.1f} MiB, far more than a plan for "
                       f"a {grid.replicas}x{grid.stages}x{grid.microbatches} grid "
                       f"({limit / 2**20:.2f} MiB at most)")
    return Plan.model_validate_json(text)
