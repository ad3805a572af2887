"""The one plan type every part shares (docs/design.md section 5), with its JSON reader and writer.

A plan is data: routes plus, per live worker, the ordered timed actions it runs. Passes
over it (validation, metrics, mapping through a replica permutation, CSV export in
planner/interop/) are small pure functions, in the spirit of torch.distributed.pipelining's
schedule IR.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from planner.job import MAX_CELLS, MAX_COUNT, MAX_TIME, JobSpec
from planner.shapes.partition import Partition  # noqa: F401 (part of the plan type)

# Every integer a plan carries is bounded like the job spec's (planner/job.py): times fit
# the spec's horizon, so they stay exact in JSON and in SQLite's int64.
Time = Annotated[int, Field(ge=0, le=MAX_TIME)]
Index = Annotated[int, Field(ge=0, le=MAX_COUNT)]

PLAN_FORMAT = "recycle.plan/v1"


@dataclass(frozen=True)
class Mode:
    """What a schedule may do: split backward into I and W, and stagger the optimizer."""
    split_backward: bool = True
    staggered: bool = True

    @property
    def optimizer(self) -> str:
        return "staggered" if self.staggered else "synchronous"


# A solver's result before it is a Plan: each live worker's timed actions
# (op, micro-batch, start, end); planner/solvers/timeline.py turns it into one.
Timeline = dict[tuple[int, int], list[tuple[str, Optional[int], int, int]]]
Op = Literal["F", "I", "W", "B", "OPT"]


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    op: Op
    microbatch: Optional[Annotated[int, Field(ge=0, le=MAX_CELLS)]] = None
    start: Time
    end: Time

    def label(self, stage: int) -> str:
        """torch.distributed.pipelining's action string, e.g. `1F3`."""
        if self.op == "OPT":
            return f"{stage}OPT"
        return f"{stage}{self.op}{self.microbatch}"


_ACTION_FIELDS = frozenset(("op", "microbatch", "start", "end"))


def make_action(op: str, microbatch: Optional[int], start: int, end: int) -> Action:
    """An Action from values our own solvers produced, without validation: what
    `model_construct` does, minus its generic overhead (a 200K-action plan is built in a
    fraction of a second instead of several seconds)."""
    a = object.__new__(Action)
    object.__setattr__(a, "__dict__", {"op": op, "microbatch": microbatch, "start": start, "end": end})
    object.__setattr__(a, "__pydantic_fields_set__", _ACTION_FIELDS)
    object.__setattr__(a, "__pydantic_extra__", None)
    object.__setattr__(a, "__pydantic_private__", None)
    return a


class WorkerPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replica: Index
    stage: Index
    actions: list[Action]

    @property
    def key(self) -> tuple[int, int]:
        return (self.replica, self.stage)


class Metrics(BaseModel):
    model_config = ConfigDict(extra="forbid")
    period: Time
    makespan: Time
    lower_bound: Time
    gap: float
    # Period measured as if the optimizer were staggered / synchronous, whatever the
    # plan's own mode: the ablation reports both (docs/design.md section 4).
    period_staggered: Optional[int] = None
    period_synchronous: Optional[int] = None


class SolverInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    status: str
    wall_s: float
    optimizer: Literal["staggered", "synchronous"] = "staggered"
    split_backward: bool = True
    bound: Optional[int] = Field(default=None, description="solver's proven bound on its objective")


WorkerId = Annotated[str, Field(min_length=1, max_length=64)]


def home_id(replica: int, stage: int) -> str:
    """A worker's default id: its home slot, `R.S` (new node workers get ids from whoever
    adds them)."""
    return f"{replica}.{stage}"


def home_of(worker: str) -> tuple[int, int]:
    """The home slot of a worker id `R.S`."""
    r, s = worker.split(".")
    return int(r), int(s)


class Role(BaseModel):
    """Live worker `worker` fills slot (replica, stage): it holds that stage's parameters
    and runs the slot's actions (docs/design.md, "Roles")."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    worker: WorkerId
    replica: Index
    stage: Index


class Move(BaseModel):
    """A worker that takes a stage it does not hold: it loads the stage's parameters and
    optimizer state (`bytes`) from a live holder (`peer`) or, when the stage has no live
    holder, from the stage's peer-memory snapshot (`snapshot`: the job rolls back to it).
    `from_stage` None: a fresh worker (new node, restarted process) with no state."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    worker: WorkerId
    from_stage: Optional[Index] = None
    to_stage: Index
    bytes: Annotated[int, Field(ge=0, le=2**62)] = 0
    source: Literal["peer", "snapshot"] = "peer"


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["recycle.plan/v1"] = PLAN_FORMAT
    job: JobSpec
    failed: list[tuple[Index, Index]]
    version: Time = 0
    routes: list[list[Index]]
    workers: list[WorkerPlan]
    metrics: Metrics
    solver: SolverInfo
    # Membership (docs/executor.md, "Who is in which plan version"): incarnations[r][s] is
    # the process incarnation of worker (r, s) that this version admits. Only that process
    # may enter the version: a restarted worker (higher incarnation) waits for a plan that
    # names it, an older one is fenced. Stamped by whoever publishes (the coordinator or
    # the service); the planner and the cache leave it None, which means 1 everywhere.
    incarnations: Optional[list[list[Annotated[int, Field(strict=True, ge=1, le=2**31)]]]] = None
    # Roles (docs/design.md, "Roles"): which live worker fills which slot. None: identity,
    # worker "r.s" runs slot (r, s), as in every plan made before roles existed. The
    # schedule (routes, workers) is per slot either way: roles only say who runs a slot.
    roles: Optional[list[Role]] = None
    # The stage changes this plan asks for (none when None or empty), with their bytes.
    moves: Optional[list[Move]] = None
    # The shape (docs/design.md section 12): which units of the user's job each stage of
    # `job` runs. None: `job` is the user's job with its own partition, as in every plan
    # made before shapes. When set, `job` is the shaped job (planner/shapes/shape.py: its
    # stages the partition's, R x S' slots, the same D*M micro-batches) and `base` names
    # the user's job; roles name workers by their home slots in the user's grid, and a
    # move's from_stage is the worker's stage in the previous plan, its bytes what it
    # lacks of its new stage's units.
    partition: Optional[Partition] = None

    @model_serializer(mode="wrap")
    def _omit_no_roles(self, handler):
        # A plan without roles writes exactly the JSON it wrote before roles existed (the
        # service splices plan JSON byte for byte; cached plans and files stay as they are).
        out = handler(self)
        if isinstance(out, dict):
            for name in ("roles", "moves", "partition"):
                if name in out and out[name] is None:
                    del out[name]
        return out

    # ---- lookups --------------------------------------------------------------------
    def incarnation(self, replica: int, stage: int) -> int:
        return self.incarnations[replica][stage] if self.incarnations else 1

    def stamped(self, version: int, incarnations: list[list[int]]) -> "Plan":
        """This plan as version `version`, admitting the given incarnations."""
        return self.model_copy(update={"version": version,
                                       "incarnations": [list(row) for row in incarnations]})

    def worker_id(self, replica: int, stage: int) -> Optional[str]:
        """Who fills slot (replica, stage): its role's worker, or `R.S` with no roles;
        None for an empty (failed) slot."""
        if self.roles is None:
            return None if [replica, stage] in [list(f) for f in self.failed] else home_id(replica, stage)
        for r in self.roles:
            if r.replica == replica and r.stage == stage:
                return r.worker
        return None

    def slot_of(self, worker: str) -> Optional[tuple[int, int]]:
        """The slot worker `worker` fills in this plan; None when it fills none."""
        if self.roles is None:
            home = home_of(worker)
            return None if list(home) in [list(f) for f in self.failed] else home
        return next(((r.replica, r.stage) for r in self.roles if r.worker == worker), None)

    def filler(self, replica: int, stage: int) -> Optional[tuple[int, int]]:
        """The home slot of the worker that fills slot (replica, stage); None: empty."""
        w = self.worker_id(replica, stage)
        return None if w is None else home_of(w)

    def live_workers(self) -> list[tuple[int, int]]:
        """The live workers (by home slot), in slot order."""
        return [self.filler(*w.key) for w in self.workers]

    def with_roles(self, roles: list[Role], moves: Optional[list[Move]] = None) -> "Plan":
        """This plan (for the failed set the roles leave empty) with its roles stamped."""
        return self.model_copy(update={"roles": sorted(roles, key=lambda r: (r.replica, r.stage)),
                                       "moves": list(moves or [])})

    def worker(self, replica: int, stage: int) -> Optional[WorkerPlan]:
        for w in self.workers:
            if w.replica == replica and w.stage == stage:
                return w
        return None

    # ---- I/O ------------------------------------------------------------------------
    def to_json(self, indent: Optional[int] = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.model_validate_json(text)

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            fh.write(self.to_json(indent=1))

    @classmethod
    def load(cls, path: str) -> "Plan":
        with open(path) as fh:
            return cls.from_json(fh.read())
