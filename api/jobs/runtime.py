"""A job as the service holds it (JobRuntime), the service's settings and its error type.

Membership (failed set, incarnations, state) is a planner/control/membership.py value the job
carries; the service only drives it (api/service.py).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

from api import stragglers
from api.hotpath.encode import PARTS
from api.models import EventIn
from planner.failures import Worker
from planner.job import JobSpec
from planner.control.membership import Membership
from planner.plan import Plan
from planner.speeds import SpeedDetector

RECENT = 16  # plan versions per job answered from memory (older ones from SQLite)


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

    @property
    def grace_s(self) -> float:
        return self.suspect_grace_s or self.heartbeat_timeout_s / 4


@dataclass
class JobRuntime:
    id: str
    spec: JobSpec
    token_hash: str
    max_failures: int
    created: float
    plan: Plan
    plan_bytes: bytes
    # Who is in which version (planner/control/membership.py): failed set, the incarnation of each
    # worker that the plan in force admits, state and halt reason. Every published version
    # is stamped with the incarnations, so they are recovered from the latest plan after a
    # restart; state, reason and failed set from the job's row.
    members: Membership = None
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

    def remember(self) -> None:
        self.recent[self.plan.version] = self.plan_bytes
        while len(self.recent) > RECENT:
            del self.recent[min(self.recent)]

    @property
    def version(self) -> int:
        return self.plan.version

    @property
    def failed(self) -> list[Worker]:
        return sorted(self.members.failed)

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
        """[replica][stage]: the speeds the plan in force was made for."""
        return stragglers.grid_of(self.plan.job)

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
            "failed_key": ";".join(f"{r}:{s}" for r, s in plan.failed) or "-"}
