"""A job as the service holds it (JobRuntime), the service's settings and its error type.

Membership (failed set, incarnations, state) is a planner/control/membership.py value the job
carries; the service only drives it (api/service.py).
"""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Optional

from api import stragglers
from api.hotpath.encode import PARTS
from api.models import EventIn
from planner.control.membership import Membership, Publish
from planner.control.roles import elastic_bound
from planner.control.timing import Patience
from planner.failures import Worker
from planner.job import JobSpec
from planner.plan import Plan, home_of
from planner.speeds import SpeedDetector

RECENT = 16  # plan versions per job answered from memory (older ones from SQLite)
# Moves are weighed over this many failure-free periods by default: the expected time
# between membership events (spot preemptions come hours apart, iterations seconds).
ELASTIC_PERIODS = 1000
# Choosing roles (planner/control/roles.py) costs ~0.25 s at 256x16 and ~1 s at 128x128,
# so the transitions that may choose them run in a thread, off the event loop; one at a
# time, since roles.py memoises one job's bounds in a module-level dict.
ROLES = threading.Lock()


def _locked(fn, *args):
    with ROLES:
        return fn(*args)


async def transition(fn, *args):
    """fn(*args) (a membership transition that may choose roles) in a thread, alone."""
    return await asyncio.to_thread(_locked, fn, *args)


async def _wait_event(event: asyncio.Event, timeout: float) -> None:
    """event.wait() with a timeout; asyncio.timeout (3.11+) needs no extra task per waiter,
    which matters when hundreds of long-polls wake at once."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout):
            await event.wait()
    else:
        await asyncio.wait_for(event.wait(), timeout)


def _ones(spec: JobSpec) -> list[list[int]]:
    """Every worker at its first incarnation."""
    return [[1] * spec.stages for _ in range(spec.replicas)]


class ApiError(Exception):
    """An answer other than 2xx, with its one-line reason."""

    def __init__(self, status: int, detail: str, **extra):
        super().__init__(detail)
        self.status, self.detail, self.extra = status, detail, extra


@dataclass
class ServiceConfig:
    heartbeat_timeout_s: float = 10.0
    suspect_grace_s: Optional[float] = None  # default: a quarter of the timeout
    precompute_failures: int = 2
    solvers: tuple[str, ...] = ("greedy", "cpsat")
    cpsat_time_limit_s: float = 10.0
    solver_workers: int = 1
    max_body_bytes: int = 1 << 20
    max_wait_s: float = 60.0
    max_grid: int = 131072          # replicas * stages * microbatches
    max_failures_limit: int = 8
    max_precompute_sets: int = 5000
    # Parsed plans the cache keeps in memory, in actions (~600 B each): a hit outside them
    # re-parses the plan (0.2 s at 4,096 workers). 300,000 keeps a failure's plan and the
    # one its recovery goes back to for jobs up to ~10,000 workers (~180 MB at most).
    cache_memory_actions: int = 300_000
    # straggler detection from heartbeat compute times (planner.speeds.SpeedDetector):
    # reports per estimate (0: no detection), slow below `enter`, nominal again above `leave`
    speed_window: int = 3
    # The detector's own thresholds (planner/speeds.py): workers measure alike either way.
    speed_enter: float = 0.7
    speed_leave: float = 0.85
    # Elastic membership (planner/control/elastic.py): a worker changes stage when the live
    # set leaves a stage short. Moves are weighed over `elastic_horizon` time units of the
    # job spec (None: ELASTIC_PERIODS failure-free periods, elastic_horizon_of); 0 moves a
    # worker only into a stage left empty. With `elastic_snapshots` (the default, as
    # `recycle train --snapshot-every auto` is) every stage's state also lives in peer
    # memory, so an empty stage is restored from it instead of halting, and too few live
    # workers pause the job (nothing is lost) rather than halt it. A job whose run reports
    # that auto chose no snapshots (its progress, snapshot_every 0) is planned without them
    # from then on. `elastic_disk`: the runs also restore a stage lost whole from a disk
    # checkpoint or their start (on by default: `recycle train` always can).
    elastic_horizon: Optional[float] = None
    elastic_snapshots: bool = True
    elastic_disk: bool = True  # as `recycle serve` (api/server.py ServeOptions)

    @property
    def grace_s(self) -> float:
        return self.suspect_grace_s or self.heartbeat_timeout_s / 4

    @property
    def patience(self) -> Patience:
        """The service's membership timing (planner/control/timing.py). A suspect with
        nobody dead is re-published after twice the grace (and a tick): by then the
        monitor has declared the suspect failed if it went silent. A paused job waits for
        an operator or its workers, however long."""
        return Patience(silent=self.heartbeat_timeout_s, suspect_grace=self.grace_s,
                        resync_after=2 * self.grace_s + 0.2, pause_limit=None)

    def elastic_horizon_of(self, spec: JobSpec) -> float:
        if self.elastic_horizon is not None:
            return self.elastic_horizon
        return ELASTIC_PERIODS * _locked(elastic_bound, spec, spec.replicas * spec.stages)

    def elastic(self, spec: JobSpec, shape: str = "auto") -> dict:
        """A job's Membership arguments that make it elastic: `failed` is then its dead
        workers, and a decision carries the empty slots to plan for and the roles. With
        shape `auto` (the job's workers can build stages of other unit ranges), fewer live
        workers than stages cut the pipeline into fewer stages (planner/shapes/); with
        `speed`, the shape is chosen at every event (cut for speed, and back)."""
        return {"job": spec, "snapshots": self.elastic_snapshots, "disk": self.elastic_disk,
                "shapes": shape != "fixed", "speed_cuts": shape == "speed",
                "horizon": self.elastic_horizon_of(spec),
                # nothing is lost while some tier holds every stage: too few live workers
                # pause the job (no version published) until enough are back; the
                # membership halts when a stage has no copy left
                "pause": self.elastic_snapshots or self.elastic_disk}


@dataclass
class JobRuntime:
    id: str
    spec: JobSpec
    token_hash: str
    max_failures: int
    created: float
    plan: Plan
    plan_bytes: bytes
    # Who is in which version (planner/control/membership.py): the dead workers, the
    # incarnation of each worker that the plan in force admits, the roles in force, state
    # and halt reason. Every published version is stamped with the incarnations and roles,
    # so they are recovered from the latest plan after a restart; state, reason and dead
    # workers from the job's row.
    members: Membership = None
    # `auto`: the service may change the pipeline's shape (registration's `shape`)
    shape: str = "fixed"
    # Speeds (api/stragglers.py): the operator's settings and the detector's levels (only
    # cells other than 1.0) that the plan in force was made for; the grid in force itself
    # is the plan's `job.speed`.
    operator: dict = field(default_factory=dict)   # (replica, stage) -> speed
    measured: dict = field(default_factory=dict)   # (replica, stage) -> speed < 1.0
    detector: Optional[SpeedDetector] = None
    fed: dict = field(default_factory=dict)        # (replica, stage) -> (incarnation, iteration)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    views: dict = field(default_factory=dict)  # (replica, stage) -> bytes, current version
    # The coordinator's last progress report (POST .../progress), in memory only: the page
    # pushes at least every second, so a report needs no wake-up of the long-polls.
    progress: Optional[dict] = None
    recent: dict = field(default_factory=dict)  # version -> plan bytes, the newest RECENT
    # Node adds (POST .../nodes): dead workers' ids given to a new node and not used yet
    # (its workers join by recovery events), with the order they were given in.
    granted: dict = field(default_factory=dict)    # (replica, stage) -> its add's number
    adds: int = 0                                  # node adds so far
    # The newest version each worker says it entered with its state in place (heartbeats'
    # entered_version): a version's moves are done once every live worker entered it.
    entered: dict = field(default_factory=dict)    # (replica, stage) -> version
    _slots: tuple = (None, None)  # (plan, {worker: slot}) of the plan in force, with roles
    _waiting: tuple = (None, None)  # (members, live workers not yet in its version)

    def note_entered(self, w: Worker, version: int) -> None:
        """A worker entered `version`; once every live one has entered the version in
        force, its movers hold their stages (Membership.entered): a donor that dies after
        that is no longer the last copy of the stage. The live workers still to enter are
        listed once per membership, not scanned per heartbeat (4,096 heartbeats a round)."""
        if version > self.entered.get(w, -1):
            self.entered[w] = version
        m = self.members
        if not m.moving:
            return
        if self._waiting[0] is not m:
            self._waiting = (m, {(r, s) for r in range(m.replicas) for s in range(m.stages)
                                 if (r, s) not in m.failed
                                 and self.entered.get((r, s), -1) < m.version})
        waiting = self._waiting[1]
        if self.entered.get(w, -1) >= m.version:
            waiting.discard(w)
        if not waiting:
            self.members = m.entered(m.version)

    def remember(self) -> None:
        self.recent[self.plan.version] = self.plan_bytes
        while len(self.recent) > RECENT:
            del self.recent[min(self.recent)]

    @property
    def version(self) -> int:
        return self.plan.version

    @property
    def failed(self) -> list[Worker]:
        """The dead workers (by home slot), as events and heartbeats name them."""
        return sorted(self.members.failed)

    @property
    def empty(self) -> list[Worker]:
        """The empty slots: the failed set the plan in force is made for (the dead workers
        while nobody changed stage)."""
        return [tuple(w) for w in self.plan.failed]

    def slot_of(self, w: Worker) -> Optional[Worker]:
        """The slot worker `w` fills in the plan in force (None: it fills none)."""
        plan = self.plan
        if plan.roles is None:
            return None if w in self.members.failed else tuple(w)
        if self._slots[0] is not plan:
            self._slots = (plan, {home_of(r.worker): (r.replica, r.stage) for r in plan.roles})
        return self._slots[1].get(tuple(w))

    @property
    def state(self) -> str:
        return self.members.state

    @property
    def reason(self) -> Optional[str]:
        return self.members.reason

    @property
    def incarnations(self) -> list[list[int]]:
        return [list(row) for row in self.members.incarnations]

    def notify(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def incarnation(self, replica: int, stage: int) -> int:
        return self.members.incarnation((replica, stage))

    @property
    def speeds(self) -> list[list[float]]:
        """[replica][stage]: the speeds the plan in force was made for (a plan of
        another shape: the job's own, as it is made for nominal speeds)."""
        return stragglers.grid_of(self.plan.job if self.plan.partition is None else self.spec)

    def check_worker(self, replica: int, stage: int) -> None:
        if not (replica < self.spec.replicas and stage < self.spec.stages):
            raise ApiError(422, f"worker {replica}:{stage} is outside the "
                                f"{self.spec.replicas}x{self.spec.stages} grid of job {self.id}")

    def halted_error(self) -> ApiError:
        return ApiError(410, self.reason or "job halted", state="halted",
                        last_version=self.version)


def _event_body(ev: EventIn) -> str:
    """The body an event_id is bound to. Without an incarnation it is the body as it was
    stored before incarnations existed, so events from before an upgrade replay as such."""
    return ev.model_dump_json(exclude=None if ev.incarnation is not None else {"incarnation"})


def _speed_answer(job: "JobRuntime", ev: dict, source: str, plan_version: int,
                  plan_source: Optional[str], spec: JobSpec) -> dict:
    w = (ev["replica"], ev["stage"])
    return {"job_id": job.id, "event_id": ev["event_id"], "kind": "speed",
            "replica": w[0], "stage": w[1], "source": source, "state": job.state,
            "reason": job.reason, "failed": job.failed, "plan_version": plan_version,
            "plan_source": plan_source, "incarnation": job.incarnation(*w),
            "speed": stragglers.speed_of(spec, w)}


def _plan_record(plan: Plan, cause: str) -> dict:
    return {"version": plan.version, "json": PARTS.plan(plan), "solver": plan.solver.name,
            "period": plan.metrics.period, "cause": cause,
            "failed_key": ";".join(f"{r}:{s}" for r, s in plan.failed) or "-",
            "moves_json": json.dumps([m.model_dump(mode="json") for m in plan.moves])
            if plan.moves else None}


def fillers(plan: Plan) -> dict[Worker, tuple[Worker, int]]:
    """Slot -> (the worker filling it, its incarnation) in `plan`."""
    if plan.roles is None:
        return {w.key: (w.key, plan.incarnation(*w.key)) for w in plan.workers}
    return {(r.replica, r.stage): (home_of(r.worker), plan.incarnation(*home_of(r.worker)))
            for r in plan.roles}


def refilled(plan: Plan, decision, workers) -> set[Worker]:
    """The slots whose filler (worker, or its process) the decision changes from `plan`:
    what was measured there belongs to another process now. With no plan (a halt): the
    slots `workers` filled."""
    if not isinstance(decision, Publish):
        gone = {tuple(w) for w in workers}
        return {slot for slot, (w, _) in fillers(plan).items() if w in gone}
    if plan.roles is None and decision.roles is None:  # the common case, without dicts
        out = set(map(tuple, plan.failed)) ^ set(decision.failed)
        old = plan.incarnations or [[1] * plan.job.stages for _ in range(plan.job.replicas)]
        for r, (a, b) in enumerate(zip(old, decision.incarnations)):
            if list(a) != list(b):
                out.update((r, s) for s, (x, y) in enumerate(zip(a, b)) if x != y)
        return out
    old = fillers(plan)
    if decision.roles is None:
        empty = set(decision.failed)
        new = {(r, s): ((r, s), decision.incarnations[r][s])
               for r in range(plan.job.replicas) for s in range(plan.job.stages)
               if (r, s) not in empty}
    else:
        new = {(x.replica, x.stage): (home_of(x.worker),
                                      decision.incarnations[home_of(x.worker)[0]][home_of(x.worker)[1]])
               for x in decision.roles}
    return {slot for slot in set(old) | set(new) if old.get(slot) != new.get(slot)}
