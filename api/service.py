"""The service's core: jobs and the failure/recovery events that change who trains.

All state changes run on the event loop under a per-job asyncio.Lock, and each accepted
event (failure, recovery, or speed: an operator's or the straggler detector's, see
api/jobs/speeds.py) is persisted together with its plan version in one transaction before
anyone is told. Who is in which version is decided by planner/control/membership.py; this module
drives it: it plans for the decision (cache or greedy), persists, and publishes. Waiters
park on a per-job asyncio.Event that is set (and replaced) on every publish
(api/jobs/updates.py).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from api import stragglers
from api.hotpath.mapping import MemoMapper
from api.jobs.nodes import NodeEvents, grants
from api.jobs.runtime import (ApiError, JobRuntime, ServiceConfig, _event_body, _ones,
                              _plan_record, refilled, transition)
from api.jobs.speeds import SpeedEvents
from api.jobs.updates import PlanUpdates
from api.metrics import Metrics
from api.models import EventIn
from api.security import hash_token, new_worker_token
from api.storage.sqlite_store import Store
from api.stragglers import SpeedError
from planner.cache import PlanCache
from planner.inputs.limits import TooLarge, check_plannable
from planner.job import JobSpec
from planner.control.decision_plan import planned_on, reusable, stamp
from planner.control.membership import Halt, Membership, Pause, Publish, Reject
from planner.plan import Plan


def own_grid(plan: Optional[Plan]) -> bool:
    """Is `plan` (None: no new one) of the job's own grid, not a shape's?"""
    return plan is None or plan.partition is None


@dataclass
class Change:
    """What a carried out membership decision leaves for the work after the lock."""
    answer: dict
    halted: bool
    plan_source: Optional[str]
    fresh: Optional[Plan]  # the plan as planned (cache or greedy), before stamping
    spec: JobSpec  # the job with the speeds planned for
    empty: list  # the empty slots it was planned for


class Service(SpeedEvents, PlanUpdates, NodeEvents):
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
            # dead workers: with roles, those filling no slot of the plan in force; a halted
            # or paused job's row also has the workers who died since that plan
            kw = {} if plan.roles is not None and row["state"] == "running" else {
                "failed": [tuple(w) for w in json.loads(row["failed_json"])]}
            shape = row["shape"] or "fixed"  # a job registered before shapes keeps its own
            members = Membership.following(
                plan, **self.config.elastic(spec, shape), state=row["state"],
                reason=row["reason"], **kw).with_speeds(plan.job.speed)
            self.jobs[row["id"]] = JobRuntime(
                id=row["id"], spec=spec, token_hash=row["token_hash"], shape=shape,
                max_failures=row["max_failures"], created=row["created"], plan=plan,
                plan_bytes=latest["plan_json"].encode(), members=members)
            job = self.jobs[row["id"]]
            job.remember()
            job.operator, job.measured = stragglers.restore(
                spec, plan.job, self.store.speed_events(job.id))
            job.detector = self._detector(spec, job.measured)
            events = self.store.events(job.id)
            job.granted, job.adds = grants(events), sum(e["kind"] == "add" for e in events)
            self.metrics.plan_version.labels(row["id"]).set(plan.version)
            self.metrics.slow_workers.labels(row["id"]).set(stragglers.slow_count(plan.job))
        self._count_jobs()

    def token_hash(self, job_id: str) -> Optional[str]:
        job = self.jobs.get(job_id)
        return job.token_hash if job else None

    def job(self, job_id: str) -> JobRuntime:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"no job {job_id!r}")
        return job

    def _count_jobs(self) -> None:
        for state in ("running", "paused", "halted", "finished"):
            self.metrics.jobs.labels(state).set(
                sum(1 for j in self.jobs.values() if j.state == state))

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
    async def register(self, spec: JobSpec, max_failures: Optional[int],
                       shape: str = "auto") -> tuple[JobRuntime, str]:
        self._check_size(spec)
        k = self.config.precompute_failures if max_failures is None else max_failures
        if not 0 <= k <= self.config.max_failures_limit:
            raise ApiError(422, f"max_failures must be between 0 and "
                                f"{self.config.max_failures_limit}")
        plan, source = await asyncio.to_thread(self._plan_now, spec, [])
        elastic = await asyncio.to_thread(self.config.elastic, spec, shape)
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
                              hash_token(token), k, record, solvers, now, shape)
        job = JobRuntime(id=job_id, spec=spec, token_hash=hash_token(token), max_failures=k,
                         created=now, plan=plan, plan_bytes=record["json"].encode(), shape=shape,
                         members=Membership.start(
                             spec.replicas, spec.stages, (), grid, 0,
                             **elastic).with_speeds(plan.job.speed),
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
            members, decision = await transition(
                job.members.fail if ev.kind == "failure" else job.members.recover,
                w, ev.incarnation)
            if isinstance(decision, Reject):
                raise ApiError(409, decision.reason)
            replacement = isinstance(decision, Publish) and decision.cause == "replacement"
            cause = f"{'replacement' if replacement else ev.kind}:{source}"

            def answer_of(m: Membership, version: int, plan_source: Optional[str]) -> dict:
                return {"job_id": job.id, "event_id": ev.event_id, "kind": ev.kind,
                        "replica": ev.replica, "stage": ev.stage, "source": source,
                        "state": m.state, "reason": m.reason, "failed": sorted(m.failed),
                        "plan_version": version, "plan_source": plan_source,
                        "incarnation": m.incarnation(w)}
            row = {**ev.model_dump(), "source": source, "body_json": body_json}
            done = await self._change(job, members, decision, cause, [w], row, answer_of, t0)
            if ev.kind == "recovery":
                job.granted.pop(w, None)  # a node add's id is used
        self._after_change(job, ev.kind, source, [w], done)
        return done.answer, False

    async def _change(self, job: JobRuntime, members: Membership, decision, cause: str,
                      workers: list, row: dict, answer_of, t0: float) -> "Change":
        """Under job.lock: carry out a membership decision about `workers` (an event's
        worker, or a node's): the speeds it leaves, its plan (for the empty slots, with the
        roles), one transaction, then the publish."""
        halted = isinstance(decision, Halt)
        held = halted or isinstance(decision, Pause)  # no version to publish
        before = job.plan
        # a slot filled by another process now: what was measured there is forgotten
        changed = refilled(job.plan, decision, workers)
        measured = {k: v for k, v in job.measured.items() if k not in changed}
        try:
            spec = stragglers.spec_for(job.spec, job.operator, measured)
        except SpeedError:  # cannot happen in practice; keep the speeds in force
            measured, spec = job.measured, job.plan.job
        members = members.with_speeds(spec.speed)
        fresh, plan, plan_source, record = None, None, None, None
        if not held:
            spec = planned_on(decision, spec)  # a shape's plan: on the job it cuts
            if reusable(decision, job.plan, spec.spec_hash()):
                fresh = job.plan  # same failed set and speeds: the plan in force,
                #                   admitting the new incarnation
            else:
                fresh, plan_source = await asyncio.to_thread(
                    self._plan_now, spec, list(decision.failed))
            plan = stamp(fresh, decision)
            record = _plan_record(plan, cause)
        answer = answer_of(members, plan.version if plan else job.version, plan_source)
        write = asyncio.ensure_future(asyncio.to_thread(
            self.store.apply_event, job.id, row, answer, members.state, members.reason,
            sorted(members.failed), record))
        # while the write waits for its fsync (in a thread, without the GIL), the new
        # version's shares are built here, ready for the long-polls that its publish
        # wakes; published only once the write is done, as always
        views = self._prebuild(job, plan) if plan is not None else {}
        await write
        job.members, job.measured = members, measured
        for w in workers:
            job.fed.pop(w, None)
        if plan is not None:
            self._install(job, plan, record["json"], cause, views)
            self.metrics.event_to_plan_seconds.observe(time.perf_counter() - t0)
        else:
            job.notify()
            self._count_jobs()
        # bookkeeping after the publish (what is stored is in force in memory first); the
        # detector's grid is the job's own: a shape's slots are of its own grid (and the
        # detector waits while one is in force, api/jobs/speeds.py)
        if job.detector is not None and own_grid(before) and own_grid(plan):
            for slot in changed:
                job.detector.forget(*slot)
        return Change(answer, halted, plan_source, fresh, spec,
                      [tuple(x) for x in plan.failed] if plan is not None else [])

    def _after_change(self, job: JobRuntime, kind: str, source: str, workers: list,
                      done: "Change") -> None:
        """After the lock: metrics, the monitor, and the plan's improvement off the
        answer's path."""
        self.metrics.events.labels(kind, source, "halted" if done.halted else "accepted").inc()
        if self.monitor:
            for w in workers:
                self.monitor.forget(job.id, w)
        if done.plan_source == "greedy":
            self._background(asyncio.to_thread(self.cache.put, done.fresh))
            if self.precomputer:
                self.precomputer.improve(job, done.empty, done.spec)
        elif done.plan_source == "cache":
            self.verify_later(job, done.empty, done.spec, done.fresh.metrics.period)

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
