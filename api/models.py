"""Request and response bodies of the HTTP API (the job spec and plan are planner's)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from planner.control.routes import MAX_INCARNATION, MAX_INDEX  # noqa: F401 (bounds of paths too)
from planner.plan import Action, Metrics, Move, SolverInfo

Index = Field(ge=0, le=MAX_INDEX, strict=True)  # strict: JSON true is not 1


def Incarnation(description: str):  # noqa: N802 - reads like the Field it returns
    return Field(default=None, ge=1, le=MAX_INCARNATION, strict=True, description=description)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(BaseModel):
    detail: str = Field(description="one-line reason")


class EventIn(_In):
    event_id: str = Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
                          description="client-chosen id; re-sending it is idempotent")
    kind: Literal["failure", "recovery"]
    replica: int = Index
    stage: int = Index
    reason: Optional[str] = Field(default=None, max_length=500)
    incarnation: Optional[int] = Incarnation(
        "the worker process's incarnation (1 for its first process, +1 per restart). "
        "recovery: of a failed worker, the incarnation that rejoins; of a live one, a newer "
        "incarnation replaces the one in the plan (its predecessor is dead). failure: an "
        "incarnation older than the plan's is stale and refused")


MAX_SPEED = 100.0  # JobSpec.speed's bound (planner/job.py)


class SpeedIn(_In):
    event_id: str = Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
                          description="client-chosen id; re-sending it is idempotent (the id "
                                      "space is shared with failure/recovery events)")
    replica: int = Index
    stage: int = Index
    speed: Optional[float] = Field(
        ..., gt=0, le=MAX_SPEED, allow_inf_nan=False, strict=True,
        description="the worker's speed factor, 0 < speed <= 100 (1.0 nominal, 0.5 twice as "
                    "slow, above 1 faster); stored quantised to steps of 0.1 (at least 0.1). "
                    "null clears the operator's setting (the detector's measurement, or the "
                    "job spec's own speed, applies again)")
    reason: Optional[str] = Field(default=None, max_length=500)


def _omitting(*names: str):
    """A serializer that leaves out the fields `names` when they are None: answers made
    before those fields existed stay byte for byte as they were."""
    def omit(self, handler):
        out = handler(self)
        if isinstance(out, dict):
            for name in names:
                if out.get(name, 0) is None:
                    del out[name]
        return out
    return model_serializer(mode="wrap")(omit)


class NodeWorker(_In):
    replica: int = Index
    stage: int = Index
    incarnation: Optional[int] = Incarnation(
        "remove: the incarnation of the process that goes (an older one than the plan's "
        "is stale, and that worker is left out)")


class NodeEventIn(_In):
    """A node removed (a spot preemption notice, an instance gone: its workers fail at
    once, in one version) or added (a new instance: its workers take the ids of dead
    workers, chosen by the service, and then join by their own recovery events)."""
    event_id: str = Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
                          description="client-chosen id; re-sending it is idempotent (the id "
                                      "space is shared with the other events)")
    kind: Literal["remove", "add"]
    workers: Optional[list[NodeWorker]] = Field(
        default=None, min_length=1, max_length=4096,
        description="remove: the node's workers (replica, stage: their ids)")
    count: Optional[int] = Field(default=None, ge=1, le=4096, strict=True,
                                 description="add: how many workers the new node runs")
    workers_per_node: Optional[int] = Field(
        default=None, ge=1, le=4096, strict=True,
        description="add: the new node is a whole node of the job at this many workers per "
                    "node (a node agent's --workers-per-node), every one of its workers dead")
    reason: Optional[str] = Field(default=None, max_length=500)


class NodeId(BaseModel):
    replica: int
    stage: int
    incarnation: int = Field(description="remove: the worker's incarnation in force; add: the "
                                         "least incarnation its new process joins with")


class EventOut(BaseModel):
    job_id: str
    event_id: str
    kind: str
    replica: Optional[int] = Field(description="the event's worker (null for a node event)")
    stage: Optional[int] = Field(description="the event's worker (null for a node event)")
    source: str
    state: Literal["running", "paused", "halted"] = Field(
        description="paused: fewer live workers than stages, nothing lost (every stage in "
                    "peer memory); no version is published until enough are back")
    reason: Optional[str] = None
    failed: list[tuple[int, int]]
    plan_version: int = Field(description="the version in force once this event is applied")
    plan_source: Optional[Literal["cache", "greedy"]] = Field(
        default=None, description="where the new plan came from; null when no plan was "
                                  "computed (a halt, or a replacement: the plan in force "
                                  "re-stamped with the new incarnation)")
    incarnation: Optional[int] = Field(
        default=None, description="the worker's incarnation in the plan version in force "
                                  "once the event is applied")
    speed: Optional[float] = Field(
        default=None, description="speed events: the worker's speed factor in the plan "
                                  "version in force once the event is applied")
    workers: Optional[list[NodeId]] = Field(
        default=None, description="node events: the workers removed, or the ids given to "
                                  "the added node's workers (absent for other events)")
    node_rank: Optional[int] = Field(
        default=None, description="node adds with workers_per_node: the vacant node given "
                                  "(absent otherwise)")

    _omit = _omitting("workers", "node_rank")


class HeartbeatIn(_In):
    replica: int = Index
    stage: int = Index
    iteration: int = Field(ge=0, le=2**62, strict=True)
    incarnation: Optional[int] = Incarnation(
        "the sender's incarnation; one other than the plan's is refused (409)")
    compute_s_per_mb: Optional[float] = Field(
        default=None, ge=0, le=1e6, allow_inf_nan=False, strict=True,
        description="seconds of compute (F+I+W) per micro-batch in the worker's last "
                    "completed iteration; feeds the straggler detector (0: no measurement)")
    compute_iteration: Optional[int] = Field(
        default=None, ge=0, le=2**62, strict=True,
        description="the iteration `compute_s_per_mb` was measured in (default: "
                    "`iteration`); each iteration is counted once per worker process")
    entered_version: Optional[int] = Field(
        default=None, ge=0, le=2**62, strict=True,
        description="the newest plan version this worker has entered with its stage's state "
                    "in place; a version's moves count as done once every live worker has")


class HeartbeatOut(BaseModel):
    state: str
    plan_version: int
    timeout_s: float
    incarnation: int = Field(description="the worker's incarnation in the current plan")


class ProgressIn(_In):
    """The coordinator's training progress (at most about one a second)."""
    iteration: int = Field(ge=0, le=2**62, strict=True,
                           description="the newest iteration whose losses are all in (0-based)")
    iterations: Optional[int] = Field(default=None, ge=1, le=2**62, strict=True,
                                      description="iterations the run trains in all")
    loss: Optional[float] = Field(
        ..., ge=-1e30, le=1e30, allow_inf_nan=False, strict=True,
        description="that iteration's mean loss over its micro-batches (null: not finite)")
    tokens_per_s: Optional[float] = Field(
        default=None, ge=0, le=1e15, allow_inf_nan=False, strict=True,
        description="tokens trained per second, measured since the report before (null: "
                    "no report before this one)")
    snapshot_every: Optional[int] = Field(
        default=None, ge=0, le=2**31, strict=True,
        description="peer-memory snapshots every this many iterations (0: off; null: auto "
                    "has not chosen yet)")
    snapshot_mib: Optional[float] = Field(
        default=None, ge=0, le=1e12, allow_inf_nan=False, strict=True,
        description="host memory the snapshots held on the worker that held most, MiB "
                    "(the run's end)")


class ProgressOut(BaseModel):
    state: str
    iteration: int


class WorkerRef(_In):
    replica: int = Index
    stage: int = Index


class SuspectIn(_In):
    replica: int = Index
    stage: int = Index
    reporter: Optional[WorkerRef] = None
    reason: Optional[str] = Field(default=None, max_length=500)


class SuspectOut(BaseModel):
    replica: int
    stage: int
    declared_failed: bool
    deadline_s: Optional[float] = Field(description="seconds until it is declared failed "
                                                    "unless it heartbeats")


class Precompute(BaseModel):
    state: Literal["queued", "running", "done", "failed", "stopped"]
    done: int
    total: int
    sets: int
    max_failures: int
    solvers: list[str]
    error: Optional[str] = None


class JobCreated(BaseModel):
    id: str
    token: str = Field(description="the job's worker token; shown only once")
    state: str
    plan_version: int
    max_failures: int


class PlanSummary(BaseModel):
    version: int
    failed_key: str
    solver: str
    period: int
    cause: str
    created: float
    moves: Optional[list[Move]] = Field(
        default=None, description="the stage changes this version asks for (absent: none)")

    _omit = _omitting("moves")


class JobOut(BaseModel):
    id: str
    state: Literal["running", "paused", "halted", "finished"]
    reason: Optional[str] = None
    spec: dict
    failed: list[tuple[int, int]]
    plan_version: int
    incarnations: list[list[int]] = Field(description="[replica][stage]: the worker "
                                                      "incarnations the current plan admits")
    speeds: list[list[float]] = Field(description="[replica][stage]: the speed factors the "
                                                  "current plan was made for (1.0 nominal)")
    max_failures: int
    shape: Literal["auto", "speed", "fixed"] = Field(
        description="auto: the service may cut the pipeline into fewer stages when too few "
                    "workers live; speed: at every event, for speed too; fixed: never")
    created: float
    plans: list[PlanSummary]
    precompute: Precompute


class SpeedSetting(BaseModel):
    replica: int
    stage: int
    speed: float


class SpeedsOut(BaseModel):
    plan_version: int
    speeds: list[list[float]] = Field(description="[replica][stage]: the speeds in force "
                                                  "(those the current plan was made for)")
    operator: list[SpeedSetting] = Field(description="speeds set by speed events (admin or "
                                                     "worker token); they take precedence")
    measured: list[list[float]] = Field(description="[replica][stage]: the straggler "
                                                    "detector's levels (1.0: not slow)")


class JobBrief(BaseModel):
    id: str
    state: str
    plan_version: int
    failed: list[tuple[int, int]]


class WorkerPlanOut(BaseModel):
    job_id: str
    version: int
    replica: int
    stage: int
    in_plan: bool = Field(description="false: this worker is not in the plan and must stop")
    slot: Optional[tuple[int, int]] = Field(
        default=None, description="with roles (docs/design.md, \"Roles\"): the slot "
                                  "[replica, stage] this worker fills, whose actions these "
                                  "are (absent in plans without roles: its own)")
    incarnation: int = Field(description="the incarnation of this worker the version admits; "
                                         "a newer process waits for a version that names it")
    failed: list[tuple[int, int]]
    routes: dict[str, list[int]] = Field(
        description="the route rows of the micro-batches this worker runs, keyed by "
                    "micro-batch: routes[g][stage] is the replica that runs g at that stage "
                    "(the whole table is in GET /plan)")
    actions: list[Action]
    metrics: Metrics
    solver: SolverInfo


class Health(BaseModel):
    status: Literal["ok"]
    jobs: int
    version: str
