"""The service's core: jobs, events, plan versions and long-poll wake-ups.

All state changes run on the event loop under a per-job asyncio.Lock, and each accepted
event (failure, recovery, or speed: an operator's or the straggler detector's, see
api/stragglers.py) is persisted together with its plan version in one transaction before
anyone is told. Waiters park on a per-job asyncio.Event that is set (and replaced) on every publish.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from api import stragglers
from api.hotpath.encode import PARTS
from api.hotpath.mapping import MemoMapper
from api.metrics import Metrics
from api.models import EventIn, SpeedIn
from api.security import hash_token, new_worker_token
from api.storage.sqlite_store import Store
from api.stragglers import SpeedError, quantize_speed
from planner.solvers.backends import solve
from planner.cache import PlanCache
from planner.failures import Worker, canonicalize
from planner.membership import Halt, Membership, Publish, Reject
from planner.inputs.limits import TooLarge, check_plannable
from planner.job import JobSpec
from planner.plan import Plan
from planner.speeds import SpeedDetector

log = logging.getLogger("recycle.api")
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
    # Who is in which version (planner/membership.py): failed set, the incarnation of each
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


class Service:
    def __init__(self, store: Store, cache: PlanCache, config: ServiceConfig, metrics: Metrics):
        self.store, self.cache, self.config, self.metrics = store, cache, config, metrics
        cache.mapper = MemoMapper()  # map_plan, memoised (api/hotpath/mapping.py)
        self.jobs: dict[str, JobRuntime] = {}
        self.monitor = None      # api.heartbeats.Monitor, set by the app
        self.precomputer = None  # api.precompute.Precomputer, set by the app
        self.prebuild = None     # (job, plan) -> the plan's node shares, set by the app
        self.closing = False
        self._tasks: set[asyncio.Task] = set()

    def release_waiters(self) -> None:
        """Shutting down: answer every parked long-poll now (204) instead of cancelling it."""
        self.closing = True
        for job in self.jobs.values():
            job.notify()

    # ---- loading -----------------------------------------------------------------------
    def load(self) -> None:
        for row in self.store.jobs():
            latest = self.store.latest_plan(row["id"])
            plan = Plan.from_json(latest["plan_json"])
            spec = JobSpec.model_validate_json(row["spec_json"])
            grid = plan.incarnations or _ones(spec)
            members = Membership.start(
                spec.replicas, spec.stages, [tuple(w) for w in json.loads(row["failed_json"])],
                grid, version=plan.version, state=row["state"], reason=row["reason"]
            ).with_speeds(plan.job.speed)
            self.jobs[row["id"]] = JobRuntime(
                id=row["id"], spec=spec, token_hash=row["token_hash"],
                max_failures=row["max_failures"], created=row["created"], plan=plan,
                plan_bytes=latest["plan_json"].encode(), members=members)
            job = self.jobs[row["id"]]
            job.remember()
            job.operator, job.measured = stragglers.restore(
                spec, plan.job, self.store.speed_events(job.id))
            job.detector = self._detector(spec, job.measured)
            self.metrics.plan_version.labels(row["id"]).set(plan.version)
            self.metrics.slow_workers.labels(row["id"]).set(stragglers.slow_count(plan.job))
        self._count_jobs()

    def _detector(self, spec: JobSpec, measured: dict) -> Optional[SpeedDetector]:
        cfg = self.config
        if cfg.speed_window <= 0:
            return None
        det = SpeedDetector(spec.replicas, spec.stages, window=cfg.speed_window,
                            enter=cfg.speed_enter, leave=cfg.speed_leave)
        for (d, s), v in measured.items():  # after a restart: the levels in force
            det.grid[d][s] = v
        return det

    def token_hash(self, job_id: str) -> Optional[str]:
        job = self.jobs.get(job_id)
        return job.token_hash if job else None

    def job(self, job_id: str) -> JobRuntime:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"no job {job_id!r}")
        return job

    def _count_jobs(self) -> None:
        for state in ("running", "halted", "finished"):
            self.metrics.jobs.labels(state).set(
                sum(1 for j in self.jobs.values() if j.state == state))

    # ---- planning ----------------------------------------------------------------------
    def _plan_now(self, spec: JobSpec, failed: list[Worker]) -> tuple[Plan, str]:
        """Cached plan if there is one, else greedy (milliseconds). Runs in a thread."""
        t0 = time.perf_counter()
        plan = self.cache.get(spec, failed, verify=False)  # the greedy check: verify_later
        if plan is not None:
            self.metrics.cache_hits.inc()
            return plan, "cache"
        self.metrics.cache_misses.inc()
        plan = solve(spec, failed, "greedy")
        self.metrics.solve_seconds.labels("greedy", "event").observe(time.perf_counter() - t0)
        return plan, "greedy"

    def warm(self, spec: JobSpec, canon) -> None:
        """Ready the event path for canonical failed set `canon` of `spec` (runs in a
        thread): its plan parsed in the cache's memory, and mapped as if its failed
        replicas were the last ones, which moves every replica, so the mapper's memo holds
        the blocks most renumberings of this set need (api/hotpath/mapping.py), and the
        JSON of every action list of both (api/hotpath/encode.py)."""
        if spec.speed is not None:  # renumbered by map_plan itself, after a greedy check
            return
        D = spec.replicas
        mapped = self.cache.get(spec, [(D - 1 - c, s) for c, s in canon.failed], verify=False)
        if mapped is not None:  # and the JSON of its workers' action lists, both numberings
            PARTS.plan(mapped)
            PARTS.plan(self.cache.get(spec, list(canon.failed), verify=False))

    def _check_size(self, spec: JobSpec) -> None:
        grid = spec.replicas * spec.stages * spec.microbatches
        if grid > self.config.max_grid:
            raise ApiError(422, f"job too large: replicas*stages*microbatches = {grid} exceeds "
                                f"this service's limit of {self.config.max_grid}")
        try:  # what the greedy plans in seconds: a registration's time is bounded
            check_plannable(spec.replicas, spec.stages, spec.microbatches)
        except TooLarge as exc:
            raise ApiError(422, str(exc)) from None

    # ---- jobs --------------------------------------------------------------------------
    async def register(self, spec: JobSpec, max_failures: Optional[int]) -> tuple[JobRuntime, str]:
        self._check_size(spec)
        k = self.config.precompute_failures if max_failures is None else max_failures
        if not 0 <= k <= self.config.max_failures_limit:
            raise ApiError(422, f"max_failures must be between 0 and "
                                f"{self.config.max_failures_limit}")
        plan, source = await asyncio.to_thread(self._plan_now, spec, [])
        if source == "greedy":
            await asyncio.to_thread(self.cache.put, plan)
        job_id = uuid.uuid4().hex[:12]
        token = new_worker_token(job_id)
        grid = _ones(spec)
        plan = plan.stamped(0, grid)
        record = _plan_record(plan, "registered")
        solvers = list(self.precomputer.solvers()) if self.precomputer else ["greedy"]
        now = time.time()
        self.store.create_job(job_id, spec.model_dump_json(), spec.spec_hash(),
                              hash_token(token), k, record, solvers, now)
        job = JobRuntime(id=job_id, spec=spec, token_hash=hash_token(token), max_failures=k,
                         created=now, plan=plan, plan_bytes=record["json"].encode(),
                         members=Membership.start(spec.replicas, spec.stages, (), grid, 0
                                                  ).with_speeds(plan.job.speed),
                         detector=self._detector(spec, {}))
        job.remember()
        self.jobs[job_id] = job
        self.metrics.plan_version.labels(job_id).set(0)
        self.metrics.slow_workers.labels(job_id).set(stragglers.slow_count(plan.job))
        self.metrics.plans_published.labels("registered").inc()
        self._count_jobs()
        if self.precomputer:
            self.precomputer.start(job)
        return job, token

    # ---- events ------------------------------------------------------------------------
    async def apply_event(self, job: JobRuntime, ev: EventIn, source: str) -> tuple[dict, bool]:
        """Apply a failure/recovery event; returns (answer, replayed). Raises ApiError.

        Incarnations (docs/api.md): a recovery of a live worker by a newer incarnation is
        a replacement (same failed set, a new version admitting the new process); a
        failure or recovery naming an incarnation older than the plan's is stale (409)."""
        t0 = time.perf_counter()
        body_json = _event_body(ev)
        async with job.lock:
            old = self._replayed(job, ev, body_json)
            if old is not None:
                return old, True
            w = (ev.replica, ev.stage)
            members, decision = (job.members.fail(w, ev.incarnation) if ev.kind == "failure"
                                 else job.members.recover(w, ev.incarnation))
            if isinstance(decision, Reject):
                raise ApiError(409, decision.reason)
            halted = isinstance(decision, Halt)
            replacement = not halted and decision.cause == "replacement"
            cause = f"{'replacement' if replacement else ev.kind}:{source}"
            # a failed or new process: the detector's level for the old one is forgotten
            measured = {k: v for k, v in job.measured.items() if k != w}
            try:
                spec = stragglers.spec_for(job.spec, job.operator, measured)
            except SpeedError:  # cannot happen in practice; keep the speeds in force
                measured, spec = job.measured, job.plan.job
            members = members.with_speeds(spec.speed)
            fresh, plan, plan_source, record = None, None, None, None
            if not halted:
                if decision.same_plan and spec.spec_hash() == job.plan.job.spec_hash():
                    fresh = job.plan  # same failed set and speeds: the plan in force,
                    #                   admitting the new incarnation
                else:
                    fresh, plan_source = await asyncio.to_thread(
                        self._plan_now, spec, list(decision.failed))
                plan = fresh.stamped(decision.version, decision.incarnation_rows())
                record = _plan_record(plan, cause)
            failed = sorted(members.failed)
            answer = {"job_id": job.id, "event_id": ev.event_id, "kind": ev.kind,
                      "replica": ev.replica, "stage": ev.stage, "source": source,
                      "state": members.state, "reason": members.reason, "failed": failed,
                      "plan_version": plan.version if plan else job.version,
                      "plan_source": plan_source, "incarnation": members.incarnation(w)}
            write = asyncio.ensure_future(asyncio.to_thread(
                self.store.apply_event, job.id,
                {**ev.model_dump(), "source": source, "body_json": body_json},
                answer, members.state, members.reason, failed, record))
            # while the write waits for its fsync (in a thread, without the GIL), the new
            # version's shares are built here, ready for the long-polls that its publish
            # wakes; published only once the write is done, as always
            views = self._prebuild(job, plan) if plan is not None else {}
            await write
            job.members, job.measured = members, measured
            job.fed.pop(w, None)
            if job.detector is not None:
                job.detector.forget(*w)
            if plan is not None:
                self._install(job, plan, record["json"], cause, views)
                self.metrics.event_to_plan_seconds.observe(time.perf_counter() - t0)
            else:
                job.notify()
                self._count_jobs()
        self.metrics.events.labels(ev.kind, source, "halted" if halted else "accepted").inc()
        if self.monitor:
            self.monitor.forget(job.id, w)
        if plan_source == "greedy":
            self._background(asyncio.to_thread(self.cache.put, fresh))  # off the answer's path
            if self.precomputer:
                self.precomputer.improve(job, failed, spec)
        elif plan_source == "cache":
            self.verify_later(job, failed, spec, fresh.metrics.period)
        return answer, False

    def verify_later(self, job: JobRuntime, failed: list[Worker], spec: JobSpec,
                     served: int) -> None:
        """After the answer: the cache's check of a served plan against greedy of the
        job's own replica numbering (planner/cache.py), left off the event's path; a
        better greedy plan is published as the next version."""
        if not self.cache.unverified(spec, failed):
            return

        async def check():
            from api.precompute import IMPROVE, greedy_if_better
            greedy = None
            if self.precomputer is not None:  # solved in a child process: the GIL stays
                try:                          # with the plan's fan-out
                    text = await self.precomputer.bg.call(
                        IMPROVE, greedy_if_better, spec.model_dump_json(),
                        [list(w) for w in failed], served)
                except Exception as e:  # noqa: BLE001 - then solve it here
                    log.warning("job %s: greedy check in a child failed: %s", job.id, e)
                else:
                    if text is None:  # not better: nothing to parse or store
                        return await asyncio.to_thread(self.cache.verify, spec, failed,
                                                       greedy=False)
                    greedy = await asyncio.to_thread(Plan.from_json, text)
            if await asyncio.to_thread(self.cache.verify, spec, failed, greedy=greedy):
                await self.offer(job, failed, "greedy:renumbered", spec)
        self._background(check())

    # ---- speeds ------------------------------------------------------------------------
    async def apply_speed(self, job: JobRuntime, ev: SpeedIn, source: str) -> tuple[dict, bool]:
        """An operator's (or a worker's) speed for one worker, or null to clear it; returns
        (answer, replayed). Idempotent by event_id like failures and recoveries."""
        body_json = ev.model_dump_json()
        async with job.lock:
            old = self._replayed(job, ev, body_json)
            if old is not None:
                return old, True
            w = (ev.replica, ev.stage)
            operator = dict(job.operator)
            if ev.speed is None:
                operator.pop(w, None)
            else:
                operator[w] = quantize_speed(ev.speed)
            event = {"event_id": ev.event_id, "replica": w[0], "stage": w[1],
                     "body_json": body_json}
            answers, fresh, plan_source, spec = await self._publish_speeds(
                job, operator, job.measured, [event], source)
        self._after_speeds(job, source, 1, fresh, plan_source, spec)
        return answers[0], False

    def _replayed(self, job: JobRuntime, ev, body_json: str) -> Optional[dict]:
        """Under job.lock: the stored answer to a re-sent event (idempotency), or None for a
        new one that may be applied (its worker in the grid, the job running); an id reused
        with another body is a 409."""
        old = self.store.event(job.id, ev.event_id)
        if old is not None:
            if old["body_json"] != body_json:
                raise ApiError(409, f"event_id {ev.event_id!r} was already used with a "
                                    "different body")
            return json.loads(old["response_json"])
        job.check_worker(ev.replica, ev.stage)
        self._check_running(job)
        return None

    def _check_running(self, job: JobRuntime) -> None:
        if job.state == "halted":
            raise ApiError(409, f"job is halted ({job.reason}); register a new job "
                                "after restoring from checkpoint")
        if job.state == "finished":
            raise ApiError(409, "job is finished: training completed")

    async def _publish_speeds(self, job: JobRuntime, operator: dict, measured: dict,
                              events: list[dict], source: str):
        """Under job.lock: record speed `events` and publish one plan version for the
        speeds they leave in force (none if those are the speeds in force already)."""
        t0 = time.perf_counter()
        try:
            spec = stragglers.spec_for(job.spec, operator, measured)
        except SpeedError as e:
            raise ApiError(422, f"speed: {e}") from None
        fresh, plan, plan_source, record = None, None, None, None
        members, decision = job.members.measured(spec.speed, f"speed:{source}")
        if isinstance(decision, Publish):
            fresh, plan_source = await asyncio.to_thread(self._plan_now, spec, job.failed)
            plan = fresh.stamped(decision.version, decision.incarnation_rows())
            record = _plan_record(plan, decision.cause)
        version = plan.version if plan else job.version
        rows = []
        for ev in events:
            answer = _speed_answer(job, ev, source, version, plan_source, spec)
            rows.append(({**ev, "kind": "speed", "source": source}, answer))
        await asyncio.to_thread(self.store.apply_events, job.id, rows, job.state, job.reason,
                                job.failed, record)
        job.operator, job.measured, job.members = operator, measured, members
        if plan is not None:
            self._install(job, plan, record["json"], f"speed:{source}")
            self.metrics.event_to_plan_seconds.observe(time.perf_counter() - t0)
            log.info("job %s: speeds changed (%s): published v%d", job.id, source, plan.version)
        return [a for _, a in rows], fresh, plan_source, spec

    def _after_speeds(self, job: JobRuntime, source: str, n: int, fresh, plan_source, spec):
        self.metrics.events.labels("speed", source, "accepted").inc(n)
        if plan_source == "greedy":
            self._background(asyncio.to_thread(self.cache.put, fresh))
            if self.precomputer:
                self.precomputer.improve(job, list(job.failed), spec)
        elif plan_source == "cache":
            self.verify_later(job, list(job.failed), spec, fresh.metrics.period)

    async def observe_compute(self, job: JobRuntime, w, incarnation: int, iteration: int,
                              seconds_per_mb: float) -> None:
        """A heartbeat's compute time per micro-batch: fed to the job's detector once per
        (worker process, iteration); a changed speed grid is applied like a speed event
        (source `detector`), so the plan follows."""
        det = job.detector
        if det is None or job.state != "running" or w in job.failed:
            return
        last = job.fed.get(w)
        if last is not None and last[0] == incarnation and iteration <= last[1]:
            return
        job.fed[w] = (incarnation, iteration)
        if seconds_per_mb <= 0:
            return
        det.observe(w[0], w[1], seconds_per_mb)
        if det.update() is not None:
            await self.apply_measured(job)

    async def apply_measured(self, job: JobRuntime) -> None:
        """Publish the detector's levels if they differ from those in force."""
        det = job.detector
        async with job.lock:
            if det is None or job.state != "running":
                return
            levels = {(d, s): v for d, row in enumerate(det.grid) for s, v in enumerate(row)
                      if v != 1.0 and (d, s) not in job.failed}
            changed = sorted(k for k in set(levels) | set(job.measured)
                             if levels.get(k, 1.0) != job.measured.get(k, 1.0))
            if not changed:
                return
            est = det.estimates()
            events = []
            for d, s in changed:
                eid = f"detector-{d}-{s}-{uuid.uuid4().hex[:8]}"
                body = {"event_id": eid, "replica": d, "stage": s,
                        "speed": levels.get((d, s), 1.0),
                        "reason": stragglers.measured_reason(est.get((d, s)),
                                                             self.config.speed_window)}
                events.append({"event_id": eid, "replica": d, "stage": s,
                               "body_json": json.dumps(body)})
            try:
                _, fresh, plan_source, spec = await self._publish_speeds(
                    job, job.operator, levels, events, "detector")
            except ApiError as e:  # speeds the spec cannot take: keep those in force
                log.warning("job %s: measured speeds not applied: %s", job.id, e.detail)
                return
        self._after_speeds(job, "detector", len(events), fresh, plan_source, spec)

    async def finish(self, job: JobRuntime) -> None:
        """Training completed: stop watching the job's workers (they exit now). Idempotent."""
        async with job.lock:
            if job.state == "halted":
                raise job.halted_error()
            if job.state == "running":
                await asyncio.to_thread(self.store.set_state, job.id, "finished")
                job.members, _ = job.members.finish()
                if self.monitor:
                    self.monitor.forget_job(job.id)
                job.notify()
                self._count_jobs()

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _prebuild(self, job: JobRuntime, plan: Plan) -> dict:
        """`plan`'s shares (job.views) for the nodes whose agents long-poll, built before it
        is published (api/fastpath.py prebuilt_views, set by the app); {} on any error:
        they are then built on demand, as without this."""
        if self.prebuild is None:
            return {}
        try:
            return self.prebuild(job, plan)
        except Exception as e:  # noqa: BLE001 - only speed is at stake
            log.warning("job %s: prebuilding shares failed: %s", job.id, e)
            return {}

    def _install(self, job: JobRuntime, plan: Plan, plan_json: str, cause: str,
                 views: Optional[dict] = None) -> None:
        job.plan, job.plan_bytes, job.views = plan, plan_json.encode(), views or {}
        # the version's pages into the database file, after the answers (a thread)
        self._background(asyncio.to_thread(self.store.checkpoint))
        job.remember()
        self.metrics.plan_version.labels(job.id).set(plan.version)
        self.metrics.slow_workers.labels(job.id).set(stragglers.slow_count(plan.job))
        self.metrics.plans_published.labels(cause.split(":")[0]).inc()
        job.notify()

    async def offer(self, job: JobRuntime, failed: list[Worker], cause: str,
                    spec: Optional[JobSpec] = None) -> bool:
        """A better plan for (`spec`, `failed`) may be in the cache now: publish it if it is
        for the job's current failed set and speeds (those of the plan in force; `spec`
        None: whatever they are) and beats the plan in force."""
        async with job.lock:
            if job.state != "running" or [tuple(x) for x in failed] != job.failed:
                return False
            current = job.plan.job
            if spec is not None and spec.spec_hash() != current.spec_hash():
                return False
            plan = await asyncio.to_thread(self.cache.get, current, job.failed)
            if plan is None or plan.metrics.period >= job.plan.metrics.period:
                return False
            job.members, decision = job.members.improved(cause)
            plan = plan.stamped(decision.version, decision.incarnation_rows())
            record = _plan_record(plan, cause)
            self.store.add_plan(job.id, record)
            self._install(job, plan, record["json"], cause)
            log.info("job %s: %s published v%d (period %d)", job.id, cause, plan.version,
                     plan.metrics.period)
            return True

    def resync_later(self, job: JobRuntime, version: int) -> None:
        self._background(self._resync_if_stuck(job, version, 2 * self.config.grace_s + 0.2))

    async def _resync_if_stuck(self, job: JobRuntime, version: int, delay: float) -> None:
        """After a suspect report, some workers have aborted their iteration and wait for a
        newer plan. If no failure followed (the suspect kept heartbeating), publish the same
        failed set again as a new version, so every worker rebuilds its communicators."""
        await asyncio.sleep(delay)
        async with job.lock:
            members, decision = job.members.resync(version)
            if not isinstance(decision, Publish):
                return
            job.members = members
            plan = job.plan.stamped(decision.version, decision.incarnation_rows())
            record = _plan_record(plan, "resync")
            self.store.add_plan(job.id, record)
            self._install(job, plan, record["json"], "resync")
            log.info("job %s: suspect alive after %.2f s: re-published v%d", job.id, delay,
                     plan.version)

    def current_canonical_key(self, job: JobRuntime) -> str:
        return canonicalize(job.spec, job.failed).key

    # ---- reading plans -----------------------------------------------------------------
    async def wait_newer(self, job: JobRuntime, after: Optional[int], wait: float) -> bool:
        """True once the job has a plan newer than `after` (or halts); False on timeout."""
        if after is None or job.version > after or job.state == "halted":
            return True
        deadline = time.monotonic() + min(max(wait, 0.0), self.config.max_wait_s)
        self.metrics.waiters.inc()
        try:
            while job.version <= after and job.state != "halted":
                left = deadline - time.monotonic()
                if left <= 0 or self.closing:
                    return False
                try:
                    await _wait_event(job.changed, left)
                except asyncio.TimeoutError:
                    return False
            return True
        finally:
            self.metrics.waiters.dec()
